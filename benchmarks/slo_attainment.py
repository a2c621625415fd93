"""SLO attainment of every speculation policy on one workload, from one command, on CPU.

    python benchmarks/slo_attainment.py [extra python -m sgl_adaspec.bench flags]

Starts a server per policy (none, static, sglang-adaptive, adaserve; tiny local models unless
--model/--draft-model are given), one at a time, and replays the same seeded synthetic Poisson
workload (24 requests, 32 output tokens, AdaServe's 60/20/20 class mix, baseline TPOT measured on
the no-speculation server) at 1 and 2 requests/s. Flags given here are appended, so they override
these (e.g. --trace FILE, --request-rate 0.5 1 2, --policies none,adaserve). Writes JSON and PNGs
to out/slo_attainment/. Last line: best_attainment_policy=<policy>.
"""

from __future__ import annotations

import sys

from sgl_adaspec.bench.cli import main

DEFAULTS = [
    "--synthetic", "poisson", "--num-requests", "24", "--output-tokens", "32",
    "--class-mix", "coding=0.6,chat=0.2,summarization=0.2", "--request-rate", "1", "2",
    "--policies", "none,static,sglang-adaptive,adaserve", "--out", "out/slo_attainment",
]  # fmt: skip


def argv_with_overrides(extra: list[str]) -> list[str]:
    """DEFAULTS with every flag given in ``extra`` replaced; --trace drops --synthetic and
    --class-mix (a trace brings its own SLOs, or the tool's default mix)."""
    given = {arg for arg in extra if arg.startswith("--")}
    if "--trace" in given:
        given |= {"--synthetic", "--class-mix"}
    kept, skip = [], False
    for arg in DEFAULTS:
        if arg.startswith("--"):
            skip = arg in given
        if not skip:
            kept.append(arg)
    return kept + extra


if __name__ == "__main__":
    sys.exit(main(argv_with_overrides(sys.argv[1:])))
