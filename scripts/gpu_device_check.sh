#!/usr/bin/env bash
# The GPU check on a lent machine (no SGLang, no network; see scripts/gpu_kit.py), one call:
#   run(carry=[".gpu-kit"], command="bash scripts/gpu_device_check.sh", timeout_s=540)
# Installs the carried kit, then benchmarks/gpu_check.py on the tiny pair within 8 minutes:
# greedy equality against no speculation, graphs captured only at start-up, adaserve deciding
# its replayed drafts, tokens/s against static EAGLE. Last line: gpu_check's ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f .gpu-kit/install.sh ] || { echo "no .gpu-kit: run scripts/gpu_kit.py and carry it" >&2; exit 2; }
eval "$(bash .gpu-kit/install.sh)"
export ADASPEC_MODEL_CACHE=/tmp/models
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
exec timeout 470 python3 benchmarks/gpu_check.py --pair tiny --loads 1,16 --tokens 48 \
  --configs none,static,adaserve-no-tiers,adaserve-tiers "$@"
