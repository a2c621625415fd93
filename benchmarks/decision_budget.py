"""How long adaserve's decision may take before it serves worse than tetris: the simulator with
each decided iteration charged a fixed decision time in place of the host's clock, so that a run
repeats exactly and many seeds fit where the host's noise would need many runs.

    python benchmarks/decision_budget.py [--cells "h100-llama8b:40,48;h100-llama8b-measured:48;
        a100x4-llama70b:8"] [--adaserve-ms 0.1,0.15,0.2,0.25,0.3] [--tetris-ms 0.11]
        [--mode decide] [--seeds 12] [--requests 400] [--seed 0]

Each run is `python -m sgl_adaspec.sim --preset P --rates R --repeats SEEDS --policies X
--charge-policy-time 1 --charge-critical-path MODE --charge-decision-ms MS`: tetris at
`--tetris-ms` (its decision as `benchmarks/policy_overhead.py` times it on the host in question),
adaserve at each decision time of `--adaserve-ms`. The table shows the attainment % (mean over
the seeds) and adaserve minus tetris in points. Last line
adaserve_affordable_decision_ms=<the longest adaserve decision on the grid at which it, and every
shorter one on the grid, stays within 0.5 point of tetris in every cell; 0 if the shortest does
not>.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from sgl_adaspec.flags import comma_floats
from sgl_adaspec.sim.engine import CRITICAL_PATH_CHARGES
from sgl_adaspec.sim.experiments import SweepConfig

sys.path.insert(0, str(Path(__file__).parent))
from charged_bar import BAR_POINTS, attainment_by_cell, cells_or_exit  # noqa: E402

DEFAULT_CELLS = "h100-llama8b:40,48;h100-llama8b-measured:48;a100x4-llama70b:8"


def attainment(preset: str, rates: tuple[float, ...], policy: str, decision_ms: float,
               args) -> dict[float, float]:  # fmt: skip
    """{rate: mean attainment over the seeds} of `policy` with every decision charged
    `decision_ms`."""
    config = SweepConfig(
        preset=preset, rates_rps=rates, num_requests=args.requests, repeats=args.seeds,
        seed=args.seed, policies=(policy,), policy_time_scale=1.0,
        charge_critical_path=args.mode, decision_ms=decision_ms,
    )  # fmt: skip
    return {rate: value for (rate, _), value in attainment_by_cell(config).items()}


def affordable(gaps: dict[float, list[float]]) -> float:
    """gaps: {adaserve's decision ms: its points against tetris in every cell} -> the longest
    decision at which it and every shorter one hold the bar in every cell (0: none)."""
    longest = 0.0
    for ms in sorted(gaps):
        if min(gaps[ms]) < -BAR_POINTS:
            break
        longest = ms
    return longest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", default=DEFAULT_CELLS, help="preset:rates;preset:rates")
    parser.add_argument("--adaserve-ms", default="0.1,0.15,0.2,0.25,0.3")
    parser.add_argument("--tetris-ms", type=float, default=0.11)
    parser.add_argument("--mode", default="decide", choices=CRITICAL_PATH_CHARGES[1:])
    parser.add_argument("--seeds", type=int, default=12, help="seeds per cell")
    parser.add_argument("--requests", type=int, default=400, help="requests per seed")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    grid = comma_floats(args.adaserve_ms)
    if not grid or any(not ms >= 0 for ms in grid) or not args.tetris_ms >= 0:
        parser.error("--adaserve-ms and --tetris-ms: decision times >= 0")
    if args.seeds < 1 or args.requests < 1:
        parser.error("--seeds and --requests must be >= 1")
    cells = cells_or_exit(parser, args.cells)
    torch.set_num_threads(1)
    print(f"attainment %, mean of {args.seeds} seeds; every decision charged ({args.mode}); "
          f"tetris's {args.tetris_ms:g} ms")  # fmt: skip
    print("| preset | rate | adaserve's decision, ms | adaserve | tetris | adaserve - tetris |")
    print("|---|---|---|---|---|---|")
    gaps: dict[float, list[float]] = {ms: [] for ms in grid}
    for preset, rates in cells:
        theirs = attainment(preset, rates, "tetris", args.tetris_ms, args)
        for ms in sorted(grid):
            ours = attainment(preset, rates, "adaserve", ms, args)
            for rate in rates:
                gap = 100.0 * (ours[rate] - theirs[rate])
                gaps[ms].append(gap)
                print(f"| {preset} | {rate:g} | {ms:g} | {100 * ours[rate]:.2f} "
                      f"| {100 * theirs[rate]:.2f} | {gap:+.2f} |")  # fmt: skip
    print(f"adaserve_affordable_decision_ms={affordable(gaps):g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
