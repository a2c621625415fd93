"""Why adaserve decodes plain under load: its iterations by mode at a loaded simulator cell, and
what its plan priced speculation at where it stood down.

    python benchmarks/stand_downs.py [--preset h100-llama8b] [--rate 48] [--seeds 12]
                                     [--requests 400] [--loaded 32] [--seed 0]

Runs adaserve in the simulator (uncharged, so repeatable) over `--seeds` seeds and counts each
decode iteration's mode (`adaserve.modes`: planned, stand down, measure plain, explore, probe,
...) among those of at least `--loaded` running requests. Where it stood down, the plan's own
report (`SpecStats.last_plan`, what /server_info shows) gives the best shape's tokens per ms
against a plain decode's: a ratio above 1 is a stand-down the plan's guard of the slower SLO
groups imposed, not one the speed of speculation did. Last line
adaserve_loaded_stand_down_share=<stood-down iterations / loaded decode iterations>.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter

import torch

from sgl_adaspec.sim.experiments import SweepConfig, SweepSetup
from sgl_adaspec.sim.latency import PRESETS
from sgl_adaspec.sim.policies import make_policy
from sgl_adaspec.speculative.adaserve.modes import Mode


def count_modes(setup: SweepSetup, workloads: list, loaded: int) -> tuple[Counter, list, list]:
    """Modes of the loaded decode iterations over every seed, the priced speedups (best
    shape's tokens per ms / a plain decode's) where they stood down, and each seed's
    attainment."""
    modes, speedups = Counter(), []

    def policy():
        adapter = make_policy("adaserve", setup.budget, setup.baseline)
        inner = adapter.policy
        draft_shape = inner.draft_shape

        def counted(num_requests, *args, **kwargs):
            shape = draft_shape(num_requests, *args, **kwargs)
            if num_requests >= loaded:
                mode = inner.draft_state.mode
                modes[mode] += 1
                plan = inner.stats.last_plan
                if mode is Mode.STAND_DOWN and plan and plan["plain_tokens_per_ms"] > 0:
                    speedups.append(plan["tokens_per_ms"] / plan["plain_tokens_per_ms"])
            return shape

        inner.draft_shape = counted
        return adapter

    runs = setup.run(policy, workloads)
    return modes, speedups, [run["attainment"] for run in runs]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="h100-llama8b", choices=sorted(PRESETS))
    parser.add_argument("--rate", type=float, default=48.0)
    parser.add_argument("--seeds", type=int, default=12)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--loaded", type=int, default=32, help="running requests at least")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.requests < 1 or args.loaded < 1 or not args.rate > 0:
        parser.error("--seeds, --requests and --loaded must be >= 1, --rate > 0")
    torch.set_num_threads(1)
    config = SweepConfig(
        preset=args.preset, rates_rps=(args.rate,), num_requests=args.requests,
        repeats=args.seeds, seed=args.seed, policies=("adaserve",),
    )  # fmt: skip
    setup = SweepSetup.of(config)
    modes, speedups, attainment = count_modes(setup, setup.workloads(args.rate), args.loaded)
    total = sum(modes.values())
    print(f"adaserve, {args.preset} at {args.rate:g} req/s, {args.seeds} seeds: attainment "
          f"{100 * statistics.fmean(attainment):.1f} % (per seed "
          f"{' '.join(f'{100 * a:.1f}' for a in attainment)})")  # fmt: skip
    print(f"decode iterations with >= {args.loaded} requests: {total}")
    for mode, count in modes.most_common():
        print(f"  {mode.value}: {count} ({100 * count / max(total, 1):.1f} %)")
    if speedups:
        above = sum(s > 1.0 for s in speedups)
        print(f"stood down with the best shape priced at {min(speedups):.2f}-{max(speedups):.2f}x "
              f"a plain decode's tokens per ms (median {statistics.median(speedups):.2f}; "
              f"above 1 in {above} of {len(speedups)})")  # fmt: skip
    print(f"adaserve_loaded_stand_down_share={modes[Mode.STAND_DOWN] / max(total, 1):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
