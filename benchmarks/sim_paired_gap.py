"""adaserve against every other policy on the same seeds, in the simulator: the gap seed by seed.

    python benchmarks/sim_paired_gap.py [--preset P] [--rates 8] [--repeats 24] [--seed 0]
        [--num-requests N] [--policies adaserve,tetris] [--sweep FILE]

The sweep's table shows each policy's mean over its seeds, and every policy runs the same seeds
(the same arrivals and acceptance draws). Seeds differ far more than policies do, so a gap of a
point between two means of three seeds says little; paired by seed it says more. Per rate and
other policy: the mean over seeds of adaserve's attainment minus the other's, its standard
error, and the seeds where adaserve is behind. With `--sweep` it reads the JSON that
`python -m sgl_adaspec.sim --out DIR` wrote (DIR/rps_sweep.json) instead of running.
Last line: adaserve_min_paired_gap_points=<the lowest mean gap over rates and policies>.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys

from sgl_adaspec.flags import comma_floats
from sgl_adaspec.sim.experiments import SweepConfig, run_rps_sweep
from sgl_adaspec.sim.latency import PRESETS

OURS = "adaserve"


def paired_gaps(rows: list[dict]) -> list[dict]:
    """rows: a sweep's rows (`run_rps_sweep`), each with `attainment_by_seed` -> per rate and
    policy other than adaserve: the mean and standard error over seeds of adaserve minus it,
    in points, the seeds, and those where adaserve is behind."""
    by_rate: dict[float, dict[str, list[float]]] = {}
    for row in rows:
        by_rate.setdefault(row["rate_rps"], {})[row["policy"]] = row["attainment_by_seed"]
    gaps = []
    for rate, seeds_of in by_rate.items():
        ours = seeds_of.get(OURS)
        if ours is None:
            raise ValueError(f"the sweep has no {OURS} row at rate {rate:g}")
        for policy, theirs in seeds_of.items():
            if policy == OURS:
                continue
            if len(theirs) != len(ours):
                raise ValueError(
                    f"{policy} ran {len(theirs)} seeds at rate {rate:g}, {OURS} {len(ours)}"
                )
            diff = [100.0 * (a - b) for a, b in zip(ours, theirs)]
            error = statistics.stdev(diff) / math.sqrt(len(diff)) if len(diff) > 1 else math.nan
            gaps.append({
                "rate_rps": rate, "policy": policy, "seeds": len(diff),
                "mean_points": statistics.fmean(diff), "stderr_points": error,
                "behind_seeds": sum(d < 0 for d in diff),
            })  # fmt: skip
    return gaps


def format_gaps(gaps: list[dict]) -> str:
    lines = [
        f"| rate | policy | seeds | {OURS} minus it, points (mean ± s.e.) "
        f"| seeds {OURS} is behind |",
        "|---|---|---|---|---|",
    ]
    for gap in gaps:
        lines.append(
            f"| {gap['rate_rps']:g} | {gap['policy']} | {gap['seeds']} | "
            f"{gap['mean_points']:+.2f} ± {gap['stderr_points']:.2f} | {gap['behind_seeds']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", help="a rps_sweep.json to read instead of running")
    parser.add_argument("--preset", choices=sorted(PRESETS), help="latency model")
    parser.add_argument("--rates", type=comma_floats, default=(8.0,), help="req/s, e.g. 6,8")
    parser.add_argument("--repeats", type=int, default=24, help="seeds per rate")
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--num-requests", type=int, help="requests per run")
    parser.add_argument("--policies", default=f"{OURS},tetris", help="comma-separated")
    args = parser.parse_args(argv)
    if args.sweep:
        with open(args.sweep) as f:
            rows = json.load(f)["rows"]
    else:
        given = {
            "preset": args.preset, "rates_rps": args.rates, "repeats": args.repeats,
            "seed": args.seed, "num_requests": args.num_requests,
            "policies": tuple(args.policies.split(",")),
        }  # fmt: skip
        try:
            config = dataclasses.replace(
                SweepConfig(), **{k: v for k, v in given.items() if v is not None}
            )
        except ValueError as error:  # an unknown policy, a rate <= 0
            parser.error(str(error))
        if OURS not in config.policies:
            parser.error(f"--policies must include {OURS}")
        rows = run_rps_sweep(config, progress=lambda line: print(line, file=sys.stderr))["rows"]
    try:
        gaps = paired_gaps(rows)
    except ValueError as error:
        parser.error(str(error))
    if not gaps:
        parser.error(f"no policy beside {OURS} to compare with")
    print(format_gaps(gaps))
    print(f"adaserve_min_paired_gap_points={min(gap['mean_points'] for gap in gaps):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
