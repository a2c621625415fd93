"""Is adaserve the best policy on AdaServe's own traces, in the simulator? Every cell of the
paper's comparison: each trace at each time compression, with the coding class at each multiple
of the baseline TPOT, every policy, through `sgl_adaspec.sim`'s trace experiment (`run_trace`).

    python benchmarks/sim_trace_cells.py --trace-dir DIR [--compressions 1.5,2]
        [--coding-scales 1.2,1.0,0.6] [--policies P,...] [--repeats R] [--seed S] [--out FILE]

DIR holds the AdaServe trace files (`adaserve_rps*.json`; the evaluation's data, not shipped
with the project). Each finished cell is written to `--out` at once and skipped when the script
is run again with the same settings, so a stopped run resumes. Prints one markdown table
(attainment %, the best of each row in bold, adaserve minus the best other policy in points),
then how many cells adaserve is best or within 0.5 point of the best in.
Last line: adaserve_min_gap_to_best_other_points=<the worst cell's adaserve minus best other>.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from sgl_adaspec.flags import comma_floats
from sgl_adaspec.sim.experiments import TRACE_METRIC, SweepConfig, run_trace

ALLOWANCE_POINTS = 0.5  # the "within 0.5 point of the best"


def cell_key(trace: Path, compression: float, scale: float, config: SweepConfig) -> str:
    """One cell's identity, with every setting that changes its figures."""
    return (
        f"{trace.stem}|x{compression:g}|coding{scale:g}|seed{config.seed}|r{config.repeats}|"
        f"{config.preset}|{','.join(config.policies)}"
    )


def table(cells: list[dict]) -> str:
    policies = [row["policy"] for row in cells[0]["rows"]]
    lines = [
        "| trace | x | coding SLO | req/s | " + " | ".join(policies) + " | adaserve - best other |",
        "|---|---|---|---|" + "---|" * (len(policies) + 1),
    ]
    for cell in cells:
        values = [100 * row["attainment"] for row in cell["rows"]]
        best = max(values)
        shown = [f"**{v:.1f}**" if v >= best - 0.05 else f"{v:.1f}" for v in values]
        lines.append(
            f"| {cell['trace']} | {cell['compression']:g} | {cell['coding_scale']:.1f}x | "
            f"{cell['rate_rps']:.2f} | " + " | ".join(shown) + f" | {cell[TRACE_METRIC]:+.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace-dir", required=True, type=Path)
    parser.add_argument("--compressions", type=comma_floats, default=(1.5, 2.0))
    parser.add_argument("--coding-scales", type=comma_floats, default=(1.2, 1.0, 0.6))
    parser.add_argument("--policies", help="comma-separated (default: every policy)")
    parser.add_argument("--repeats", type=int, default=1, help="engine seeds per cell")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("out/sim/trace_cells.json"))
    args = parser.parse_args(argv)
    traces = sorted(args.trace_dir.glob("adaserve_rps*.json"))
    if not traces:
        parser.error(f"no AdaServe trace (adaserve_rps*.json) in {args.trace_dir}")
    base = SweepConfig(repeats=args.repeats, seed=args.seed, out_dir=str(args.out.parent))
    if args.policies:
        base = dataclasses.replace(base, policies=tuple(args.policies.split(",")))
    if "adaserve" not in base.policies or len(base.policies) < 2:
        parser.error("--policies must hold adaserve and at least one other policy")
    done = json.loads(args.out.read_text()) if args.out.exists() else {}
    cells = []
    for trace in traces:
        for compression in args.compressions:
            for scale in args.coding_scales:
                config = dataclasses.replace(
                    base, trace=str(trace), time_compression=compression,
                    relative_slo_scale=scale,
                )  # fmt: skip
                key = cell_key(trace, compression, scale, config)
                if key not in done:
                    started = time.perf_counter()
                    print(f"{trace.stem} x{compression:g} coding {scale:g}x:", flush=True)
                    result = run_trace(config, progress=lambda line: print(line, flush=True))
                    done[key] = {
                        "trace": trace.stem.removeprefix("adaserve_").removesuffix("_ol256"),
                        "compression": compression,
                        "coding_scale": scale,
                        "rate_rps": result["rate_rps"],
                        "rows": [
                            {"policy": r["policy"], "attainment": r["attainment"]}
                            for r in result["rows"]
                        ],
                        TRACE_METRIC: result[TRACE_METRIC],
                        "wall_s": time.perf_counter() - started,
                    }
                    args.out.parent.mkdir(parents=True, exist_ok=True)
                    args.out.write_text(json.dumps(done, indent=1) + "\n")
                cells.append(done[key])
    print(table(cells))
    gaps = [cell[TRACE_METRIC] for cell in cells]
    held = sum(gap >= -ALLOWANCE_POINTS for gap in gaps)
    print(
        f"adaserve best or within {ALLOWANCE_POINTS} point of the best other policy in {held} of "
        f"{len(cells)} cells ({args.repeats} engine seed(s) per cell from seed {args.seed})"
    )
    print(f"adaserve_min_gap_to_best_other_points={min(gaps):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
