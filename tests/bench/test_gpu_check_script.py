"""`benchmarks/gpu_check.py` on the CPU recipe (tiny pair): the GPU check's own code runs here,
all five configurations start, every greedy output equals no speculation's, no graph is
captured after start-up, and adaserve builds its tier set."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


@pytest.mark.slow  # ~3 min: five servers one after another
def test_gpu_check_runs_on_the_cpu_recipe(models):
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--pair", "tiny", "--loads", "1,2",
         "--tokens", "16"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    out = run.stdout
    assert run.returncode == 0, out + run.stderr[-3000:]
    for config in ("none", "static", "sglang-adaptive", "adaserve-no-tiers", "adaserve-tiers"):
        assert f"{config}: outputs differing 0, graph captures after start-up 0" in out
    tiers_line = next(line for line in out.splitlines() if line.startswith("adaserve-tiers:"))
    assert "[1, 1]" in tiers_line  # the tier set was built
    assert out.strip().splitlines()[-1].startswith(
        "adaserve_tiers_tokens_per_s_over_static_at_max_load="
    )
