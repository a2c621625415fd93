#!/usr/bin/env bash
# `make gpu-check`: the GPU path on one CUDA GPU, in one command (docs/deployment.md).
# Creates .venv-gpu (sglang==0.5.23 with its CUDA dependencies from PyPI, this package editable),
# or uses GPU_VENV, an existing CUDA environment with sglang==0.5.23 (for a machine without
# PyPI access); then runs the tests marked `gpu` and benchmarks/gpu_check.py.
# Models: SmolLM2-135M-Instruct from its PyPI wheel and the committed EAGLE draft; nothing is
# fetched from a model hub. ARGS are passed to the benchmark.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${GPU_VENV:-$repo/.venv-gpu}"
if [ -z "${GPU_VENV:-}" ]; then
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
  "${pip[@]}" sglang==0.5.23
  "${pip[@]}" -r "$repo/requirements-dev.txt"
  "${pip[@]}" --no-deps -e "$repo"
fi
py="$venv/bin/python"
"$py" - <<'PY'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("gpu-check: no CUDA device visible to torch " + torch.__version__)
print("gpu-check:", torch.cuda.get_device_name(0), "torch", torch.__version__)
PY
# The SmolLM2 folder is prepared once (PyPI wheel, sha256-checked) before servers start.
"$py" -m sgl_adaspec.models.smollm2
cd "$repo"
"$py" -m pytest -q -m gpu tests/gpu
# shellcheck disable=SC2086
"$py" benchmarks/gpu_check.py ${ARGS:-}
