"""Assemble a "carry kit" that lets SGLang 0.5.23 and this plugin start on a lent GPU machine.

The lent machines (Python 3.12, torch 2.11+cu130, triton 3.6) have no network and no SGLang; a call
may carry 64 MiB of files. The kit holds SGLang's pure-Python tree (pruned, xz), the wheels SGLang
imports that the image lacks, this plugin's wheel, the tiny test models and `install.sh`.

    .venv/bin/python scripts/gpu_kit.py [--out DIR] [--no-check]
    # device call: carry [".gpu-kit"], command: eval "$(bash .gpu-kit/install.sh)"; ...
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import textwrap
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SGLANG = "sglang==0.5.23"
SGLANG_TAR = "sglang-0.5.23-py3.tar.xz"
MODELS_TAR = "models.tar.xz"
LIMIT_BYTES = 64 * 1024 * 1024  # what one device call may carry
# The image's glibc is recent (Ubuntu 24.04's 2.39); pip matches manylinux_2_N tags exactly.
PLATFORMS = ["manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64"] + [
    f"manylinux_2_{n}_x86_64" for n in range(5, 40)
]
TARGET_MARKERS = {  # the lent machines' interpreter, for evaluating Requires-Dist markers
    "python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython",
    "platform_python_implementation": "CPython", "sys_platform": "linux", "os_name": "posix",
    "platform_system": "Linux", "platform_machine": "x86_64", "extra": "",
}  # fmt: skip

# /work/.library/device/KINDS.md, "Python packages already there" (read 2026-11-17).
IMAGE_PACKAGES = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops
equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch
grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig
interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft
nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime
onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint
packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache
protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions
pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore
threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric
torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect
urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split()
# The versions KINDS.md's pip-list row gives; only used to warn where the image differs from a pin.
IMAGE_VERSIONS = {
    "accelerate": "1.15.0", "huggingface-hub": "1.33.0", "numpy": "2.5.2", "safetensors": "0.8.0",
    "sentencepiece": "0.2.2", "tokenizers": "0.23.2", "transformers": "5.17.0",
}  # fmt: skip

_IPYTHON_EXTRA = "IPython's interactive deps; `from IPython.display import HTML` needs none"
# Pinned requirements that the plain HTTP server + EAGLE path never imports (the import check
# below hides them): not carried.
SERVER_DROPS = {
    "datasets": "HF datasets: only sglang.benchmark's dataset loaders import it, not the server",
    "multiprocess": "only datasets' dependency",
    "sglang-router": "the separate Rust router for several servers (docs/parallel.md)",
    **{name: _IPYTHON_EXTRA for name in (
        "asttokens", "executing", "ipython-pygments-lexers", "jedi", "matplotlib-inline", "parso",
        "pexpect", "prompt-toolkit", "ptyprocess", "pure-eval", "stack-data", "wcwidth",
    )},
}  # fmt: skip
# Carried although they look optional, because the import check fails without them (module-level
# imports on the server path): ipython + traitlets (sglang/utils.py: IPython.display, via
# sglang/__init__), openai + jiter + distro + sniffio (srt/entrypoints/openai/protocol.py:
# openai.types), soundfile + cffi + pycparser (http_server -> serving_transcription ->
# audio_chunking), dill (srt/sampling/custom_logit_processor.py, via srt/configs).

# Pruned from SGLang's tree (relative globs), with why each is never imported on our path.
PRUNES = {
    "sglang/multimodal_gen": "diffusion generation runtime (sglang serve on diffusion models)",
    "**/*.so": "cp311 Rust extensions (Rust server, gRPC, multimodal, tree-core): 3.12 cannot load",
    "sglang/test": "test suites; runtime uses: demos, or env-gated (SGLANG_TEST_SCRIPTED_RUNTIME)",
    "**/docs": "markdown deployment notes (hf3fs)",
    "**/*.md": "READMEs; nothing opens them",
}
# What the import check loads from the pruned tree: the server entry point, the processes it
# spawns, the llama/EAGLE model path, the torch/triton attention backends and the plugin.
CHECK_MODULES = [
    "sglang.launch_server",
    "sglang.srt.entrypoints.http_server",
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.tokenizer_manager",
    "sglang.srt.managers.detokenizer_manager",
    "sglang.srt.managers.data_parallel_controller",
    "sglang.srt.model_executor.model_runner",
    "sglang.srt.model_loader.loader",
    "sglang.srt.models.llama",
    "sglang.srt.models.llama_eagle",
    "sglang.srt.speculative.eagle_worker_v2",
    "sglang.srt.layers.attention.triton_backend",
    "sglang.srt.layers.attention.torch_native_backend",
    "sglang.srt.constrained.xgrammar_backend",
    "sgl_adaspec.adapters.plugin",
]


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / ".gpu-kit", help="kit folder")
    parser.add_argument("--no-check", action="store_true", help="skip the pruned-tree import check")
    return parser.parse_args()


def fresh_out(out: Path) -> None:
    """Empty the kit folder (two versions of a wheel would stop the install there)."""
    kit_names = {"wheels", "install.sh", SGLANG_TAR, MODELS_TAR}
    present = list(out.iterdir()) if out.is_dir() else []
    strangers = sorted(p.name for p in present if p.name not in kit_names)
    if strangers:  # not a kit made here: never delete someone's folder
        sys.exit(f"gpu_kit: {out} holds {strangers[:3]}, not a kit's files; refusing to empty it")
    shutil.rmtree(out, ignore_errors=True)
    (out / "wheels").mkdir(parents=True)


def pip_download(
    spec: str, dest: Path, python_version: str = "3.12"
) -> subprocess.CompletedProcess:
    """The one way this script reaches the network: a binary-only, no-deps `pip download`."""
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    cmd = [
        sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
        "--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
        *platforms, "-d", str(dest), spec,
    ]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True)


def download_sglang(tmp: Path) -> Path:
    """SGLang's only wheel is cp311; fetched for 3.11 and unpacked, never pip-installed."""
    result = pip_download(SGLANG, tmp, python_version="3.11")
    wheels = sorted(tmp.glob("sglang-*.whl"))
    if result.returncode or not wheels:
        sys.exit(f"gpu_kit: could not download {SGLANG}: {last_line(result.stderr)}")
    return wheels[0]


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if not line.startswith("WARNING: Location")]
    return lines[-1] if lines else "no output"


def unpack_wheel(wheel: Path, tree: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tree)


def tree_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def prune_tree(tree: Path) -> list[tuple[str, int, str]]:
    """Delete PRUNES from the unpacked tree; returns (glob, bytes removed, why) per glob."""
    report = []
    for pattern, why in PRUNES.items():
        removed = 0
        for path in sorted(tree.glob(pattern), key=lambda p: len(p.parts)):
            if not path.exists():  # inside a folder removed just before
                continue
            removed += tree_bytes(path)
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        report.append((pattern, removed, why))
    return report


def dist_entries(names: set[str]) -> set[str]:
    """Top-level site-packages entries (packages, modules, dist-info) of the named distributions."""
    entries = set()
    for dist in importlib.metadata.distributions():
        if norm(dist.metadata["Name"]) in names:
            for file in dist.files or ():
                first = file.parts[0]
                if first != ".." and first != "__pycache__":
                    entries.add(first)
    return entries


def shadow_site(tmp: Path, hidden: set[str]) -> Path:
    """A copy (by symlinks) of this venv's site-packages without `hidden` distributions or
    SGLang, so imports see what the GPU machine will: the image, the kit and the pruned tree."""
    site = Path(sysconfig.get_paths()["purelib"])
    skip = dist_entries(hidden | {"sglang"})
    shadow = tmp / "shadow-site"
    shadow.mkdir()
    for entry in site.iterdir():
        if entry.name not in skip:
            (shadow / entry.name).symlink_to(entry)
    return shadow


def check_tree_imports(tree: Path, shadow: Path) -> bool:
    """Import CHECK_MODULES and every plugin module (but __main__s) with the pruned tree first on
    sys.path and dropped packages hidden (Python 3.11 here, not the machine's 3.12)."""
    code = textwrap.dedent(f"""
        import importlib, importlib.metadata, pkgutil, site, sys
        site.addsitedir({str(shadow)!r})  # processes the .pth files (editable plugin) too
        sys.path.insert(0, {str(tree)!r})
        import sgl_adaspec
        plugin = [m.name for m in pkgutil.walk_packages(sgl_adaspec.__path__, "sgl_adaspec.")]
        names = {CHECK_MODULES!r} + [m for m in plugin if not m.endswith("__main__")]
        failed = []
        for name in names:
            try:
                importlib.import_module(name)
            except Exception as exc:
                failed.append(f"{{name}}: {{exc!r}}")
        import sglang
        assert sglang.__file__.startswith({str(tree)!r}), sglang.__file__
        # The plugin refuses any SGLang but 0.5.23, read from the kept dist-info.
        assert importlib.metadata.version("sglang") == {SGLANG.split("==")[1]!r}
        print("\\n".join(failed) or f"ok {{len(names)}}")
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cmd = [sys.executable, "-S", "-c", code]  # -S: no site-packages but the shadow's
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    out = result.stdout.strip().splitlines()[-1:] or [""]
    if result.returncode or not out[0].startswith("ok "):
        print(f"  import check FAILED:\n{result.stdout.strip()}\n{result.stderr.strip()[-3000:]}")
        return False
    print(f"  import check ok: {out[0][3:]} modules (SGLang server path + plugin) import from the "
          "pruned tree with the dropped packages hidden")  # fmt: skip
    return True


def pack_tree(src: Path, names: list[str], dest: Path) -> None:
    """tar.xz at preset 9 of `names` under `src`, owner-neutral."""

    def neutral(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    with tarfile.open(dest, "w:xz", preset=9) as tar:
        for name in names:
            tar.add(src / name, arcname=name, filter=neutral)


def read_pins() -> dict[str, str]:
    """requirements-cpu.txt as {normalized name: pinned version}."""
    pins = {}
    for line in (REPO / "requirements-cpu.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[norm(name)] = version
    return pins


def select_wheels(pins: dict[str, str]) -> dict[str, str]:
    """The pins to carry: not on the image, not dropped for the server path (each drop printed)."""
    image = {norm(name) for name in IMAGE_PACKAGES}
    carry = {}
    for name, version in sorted(pins.items()):
        if name in image:
            seen = IMAGE_VERSIONS.get(name)
            if seen and seen != version:
                print(f"  note: {name} pinned {version}, the image has {seen}; not carried")
        elif name in SERVER_DROPS:
            print(f"  drop: {name}=={version}: {SERVER_DROPS[name]}")
        else:
            carry[name] = version
    return carry


def download_wheel(name: str, version: str, dest: Path) -> str:
    """The pinned cp312 wheel, else the nearest older one, else the newest; returns what came."""
    for spec in (f"{name}=={version}", f"{name}<{version}", f"{name}>{version}"):
        result = pip_download(spec, dest)
        if result.returncode == 0:
            got = wheel_version(dest, name)
            if got != version:
                print(f"  fallback: {name}=={version} has no cp312 manylinux wheel; carried {got}")
            return got
    print(f"  MISSING: no cp312 manylinux wheel of {name}: {last_line(result.stderr)}")
    return ""


def wheel_version(wheels: Path, name: str) -> str:
    for wheel in wheels.glob("*.whl"):
        dist, version = wheel.name.split("-")[:2]
        if norm(dist) == name:
            return version
    return "?"


def unmet_requirements(wheels: Path, carried: set[str]) -> list[str]:
    """Requires-Dist of the carried wheels (for Python 3.12 on Linux) met by neither the image
    nor the kit nor a deliberate drop: worth a look before a device call."""
    from packaging.requirements import Requirement

    have = carried | {norm(n) for n in IMAGE_PACKAGES} | set(SERVER_DROPS)
    unmet = []
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
            lines = archive.read(meta).decode().splitlines()
        for line in lines:
            if line.startswith("Requires-Dist:"):
                req = Requirement(line.split(":", 1)[1].strip())
                if (not req.marker or req.marker.evaluate(TARGET_MARKERS)) and (
                    norm(req.name) not in have
                ):
                    unmet.append(f"{wheel.name.split('-')[0]} needs {req}")
    return unmet


def build_plugin_wheel(dest: Path, tmp: Path) -> None:
    """The plugin's pure-Python wheel, built from a copy so no build/ lands in the working tree."""
    src = tmp / "plugin-src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    shutil.copytree(REPO / "sgl_adaspec", src / "sgl_adaspec", ignore=ignore)
    for name in ("pyproject.toml", "README.md", "LICENSE"):  # what pyproject.toml names
        if (REPO / name).exists():
            shutil.copy2(REPO / name, src / name)
    cmd = [
        sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
        "--no-build-isolation", str(src), "-w", str(dest),
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"gpu_kit: building the plugin wheel failed: {last_line(result.stderr)}")


def smollm2_note() -> str:
    """SmolLM2 stays behind (hundreds of MB); says how big its prepared folder is, if any."""
    from sgl_adaspec.models.smollm2 import FOLDER_NAME, MARKER, MARKER_VERSION
    from sgl_adaspec.models.tiny import default_cache_dir

    folder = default_cache_dir() / FOLDER_NAME
    marker = folder / MARKER
    if marker.exists() and marker.read_text().strip() == MARKER_VERSION:
        return f"{FOLDER_NAME}: not carried: {tree_bytes(folder) / 1e6:.0f} MB ({folder})"
    return f"{FOLDER_NAME}: not carried: not prepared here"


def pack_models(dest: Path) -> None:
    """tiny-llama and its EAGLE draft (built offline in seconds if missing), for /tmp/models."""
    from sgl_adaspec.models.tiny import ensure_models

    models = ensure_models()
    assert models.target.parent == models.eagle_draft.parent
    pack_tree(models.target.parent, [models.target.name, models.eagle_draft.name], dest)


def write_install_sh(out: Path) -> None:
    script = f"""\
        #!/usr/bin/env bash
        # On the lent GPU machine: eval "$(bash .gpu-kit/install.sh)" installs, sets PYTHONPATH.
        set -euo pipefail
        cd "$(dirname "$0")"
        python3 -m pip install -q --no-index --no-deps --no-compile --upgrade \\
          --target /tmp/site wheels/*.whl >&2
        tar -xJf {SGLANG_TAR} -C /tmp/site
        mkdir -p /tmp/models && tar -xJf {MODELS_TAR} -C /tmp/models
        echo "export PYTHONPATH=/tmp/site"
    """
    path = out / "install.sh"
    path.write_text(textwrap.dedent(script))
    path.chmod(0o755)


def summarize(out: Path) -> tuple[int, list[tuple[int, str]]]:
    """Print each kit file with its size; returns the total and the sizes, largest first."""
    files = sorted(p for p in out.rglob("*") if p.is_file())
    sizes = [(p.stat().st_size, str(p.relative_to(out))) for p in files]
    width = max(len(name) for _, name in sizes)
    print(f"\n{'file':<{width}}  {'bytes':>10}  {'MiB':>6}")
    for size, name in sizes:
        print(f"{name:<{width}}  {size:>10}  {size / 2**20:>6.2f}")
    total = sum(size for size, _ in sizes)
    limit = f"(limit {LIMIT_BYTES / 2**20:.0f} MiB)"
    print(f"{'total':<{width}}  {total:>10}  {total / 2**20:>6.2f}  {limit}")
    return total, sorted(sizes, reverse=True)


def main() -> int:
    args = parse_args()
    out = args.out.resolve()
    fresh_out(out)
    pins = read_pins()
    with tempfile.TemporaryDirectory(prefix="gpu-kit-") as tmp:
        tmp = Path(tmp)
        print(f"[1] {SGLANG}: download, unpack, prune")
        tree = tmp / "sglang-tree"
        unpack_wheel(download_sglang(tmp), tree)
        for pattern, removed, why in prune_tree(tree):
            print(f"  prune {pattern:<22} {removed / 2**20:6.1f} MiB  {why}")
        print(f"  kept {tree_bytes(tree) / 2**20:.1f} MiB unpacked")

        print("[2] wheels SGLang imports that the image lacks (cp312 manylinux x86_64)")
        carry = select_wheels(pins)
        wheels = out / "wheels"
        carried = {name for name, pin in carry.items() if download_wheel(name, pin, wheels)}
        for problem in unmet_requirements(wheels, carried):
            print(f"  unmet: {problem}")

        if not args.no_check:
            hidden = {norm(d.metadata["Name"]) for d in importlib.metadata.distributions()}
            hidden -= carried | {norm(n) for n in IMAGE_PACKAGES} | {"sgl-adaspec"}
            if not check_tree_imports(tree, shadow_site(tmp, hidden)):
                return 1
        # sglang/ and its dist-info: the plugin reads SGLang's version from the latter.
        pack_tree(tree, sorted(p.name for p in tree.iterdir()), out / SGLANG_TAR)

        print("[3] the plugin's wheel")
        build_plugin_wheel(wheels, tmp)
    print("[4] models")
    print(f"  {smollm2_note()}")
    pack_models(out / MODELS_TAR)
    write_install_sh(out)

    total, largest = summarize(out)
    if total > LIMIT_BYTES:
        top = ", ".join(f"{name} ({size / 2**20:.1f} MiB)" for size, name in largest[:5])
        sys.stdout.flush()
        print(f"gpu_kit: the kit is {total} bytes, over the {LIMIT_BYTES}-byte carry limit; "
              f"largest: {top}", file=sys.stderr)  # fmt: skip
        print(f"gpu_kit_bytes={total}")
        return 1
    print(f"gpu_kit_bytes={total}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
