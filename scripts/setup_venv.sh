#!/usr/bin/env bash
# Create or update the project's CPU virtual environment in .venv (idempotent).
# Slim recipe: CPU torch + triton, sglang without its CUDA dependency tree, pinned runtime deps,
# then this package in editable mode. Never installs torchvision (it would pull a CUDA torch).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo/.venv"
stamp="$venv/.sgl_adaspec_stamp"
want="$(cat "$repo/requirements-cpu.txt" "$repo/requirements-dev.txt" "$repo/pyproject.toml" "$0" | sha256sum | cut -d' ' -f1)"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q --no-warn-conflicts)
# TORCH_INDEX_URL (optional): a CPU wheel index for torch where the default one serves CUDA builds.
"${pip[@]}" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} torch==2.13.0
"${pip[@]}" triton==3.8.0
"${pip[@]}" --no-deps sglang==0.5.23
"${pip[@]}" --no-deps -r "$repo/requirements-cpu.txt"
"${pip[@]}" -r "$repo/requirements-dev.txt"
"${pip[@]}" --no-deps -e "$repo"
# SGLang imports torchvision at module level; the real one cannot sit beside the CPU torch.
# A .pth line installs the placeholder (sgl_adaspec/adapters/platform/torchvision_stub.py) at interpreter
# start, before SGLang's spawned children import anything.
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "import sgl_adaspec.adapters.platform.torchvision_stub as s; s.install()" > "$site/sgl_adaspec_torchvision.pth"
# Fail here, not in a test, if anything pulled a CUDA torch.
"$venv/bin/python" - <<'PY'
import torch, sys
if torch.version.cuda is not None:
    sys.exit(f"setup_venv: a CUDA torch ({torch.__version__}) was installed; expected the CPU build")
PY
echo "$want" > "$stamp"
