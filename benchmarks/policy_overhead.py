"""How much time adaserve's own calls take per iteration, on the server's code path.

    python benchmarks/policy_overhead.py [--preset a100x4-llama70b] [--rates 2,8]
                                         [--requests 200] [--repeats 3] [--seed 0]
                                         [--policies adaserve,tetris] [--server-trees]

The simulator drives the policy through the calls the SGLang adapter makes (`draft_shape`,
`keep_draft_warm`, `decide`, `iteration_launched`, `observe`, `draft_prefills`;
`sim.policies.ServerPolicy`), and this script times those calls alone with a wall clock,
single-threaded: the simulator's own work (the draft trees, the accept walk) is left out. On a server the same time sits on the
scheduler's critical path of every iteration. Per rate: the policy's ms per speculative and
per plain iteration (mean over the run's iterations, median over `--repeats` runs of the same
workload), the mean running requests, and the share of iterations that speculated; each
policy of `--policies` (server policies: adaserve, tetris, adaspec, faser, dropin;
adaserve-full-draft: adaserve with every draft the configured search, as on a server without
draft tiers) on the same workload, so adaserve's time reads beside another policy's on the
same host.
Each speculative iteration's time is split: `decide` on the critical path (between the draft
and the verify's launch), the rest overlapped with the device's work under SGLang's overlap
scheduler (`Clock`). `--server-trees`: the candidates carry no layout promise but their depths,
as those the SGLang adapter builds from SGLang's verify tree (the simulator's say they are a
beam search's, so narrowing them to the drafted shape costs nothing). Last lines:
adaserve_policy_ms_per_speculative_iteration= and
adaserve_critical_path_ms_per_speculative_iteration=, each the largest over rates.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from sgl_adaspec.sim.experiments import SweepConfig, SweepSetup
from sgl_adaspec.sim.policies import SERVER_POLICY_NAMES, make_policy

TIMED_CALLS = (
    "draft_shape", "keep_draft_warm", "draft_runs", "decide", "iteration_launched", "observe",
    "draft_prefills",
)
# adaserve where the draft runs the configured search, not the plan's shape (a server without
# a draft tier for it): told the shape before the draft (`draft_runs`).
OTHER_NAMES = SERVER_POLICY_NAMES + ("adaserve-full-draft",)


class Clock:
    """Wall time spent in the policy's timed calls, charged to the iteration they belong to:
    `decide` on the critical path (the verify cannot launch before it returns), the others
    (the plan before the draft, `observe` after the verify) where they overlap the device's
    work of the iteration before under SGLang's overlap scheduler."""

    def __init__(self, policy) -> None:
        self.pending_ms = {"critical": 0.0, "overlapped": 0.0}
        self.speculative: list[dict[str, float]] = []
        self.plain: list[dict[str, float]] = []
        self.running: list[int] = []
        for name in TIMED_CALLS:
            setattr(policy, name, self._timed(getattr(policy, name), name))

    def _timed(self, call, name: str):
        part = "critical" if name == "decide" else "overlapped"

        def timed(*args, **kwargs):
            started = time.perf_counter()
            result = call(*args, **kwargs)
            self.pending_ms[part] += 1e3 * (time.perf_counter() - started)
            if name == "observe":  # the iteration's last call
                outcome = args[0]
                (self.speculative if outcome.speculated else self.plain).append(self.pending_ms)
                self.running.append(len(outcome.rids))
                self.pending_ms = {"critical": 0.0, "overlapped": 0.0}
            return result

        return timed


def one_run(
    setup: SweepSetup, workload, name: str = "adaserve", server_trees: bool = False
) -> Clock:
    clocks = []

    def policy():
        adapter = make_policy(name, setup.budget, setup.baseline)
        adapter.layout_promise = not server_trees
        clocks.append(Clock(adapter.policy))
        return adapter

    setup.run(policy, [workload])
    return clocks[0]


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def _per_iteration(clocks: list[Clock], kind: str, part: str | None = None) -> float:
    """Median over runs of the mean ms per iteration of `kind` (its `part`, or all)."""
    return statistics.median(
        _mean([sum(ms.values()) if part is None else ms[part] for ms in getattr(c, kind)])
        for c in clocks
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="a100x4-llama70b")
    parser.add_argument("--rates", default="2,8", help="requests per second, comma-separated")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policies", default="adaserve", help="comma-separated; adaserve first")
    parser.add_argument("--server-trees", action="store_true",
                        help="candidates without a layout promise, as the SGLang adapter's")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.policies.split(",") if n.strip()]
    if not names or names[0] != "adaserve" or any(n not in OTHER_NAMES + ("adaserve",)
                                                    for n in names):  # fmt: skip
        parser.error(f"--policies: adaserve first, then any of {', '.join(OTHER_NAMES)}")
    torch.set_num_threads(1)
    rates = tuple(float(r) for r in args.rates.split(","))
    config = SweepConfig(
        preset=args.preset, rates_rps=rates, num_requests=args.requests, repeats=1,
        seed=args.seed, policies=("adaserve",),
    )  # fmt: skip
    setup = SweepSetup.of(config)
    print(f"each policy's own calls per iteration, {args.preset}, {args.requests} requests, "
          f"median of {args.repeats} runs")  # fmt: skip
    print("| policy | rate | running (mean) | speculative share | ms per speculative "
          "| of it critical (decide) | of it overlapped | ms per plain |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    critical, total = [], []
    for rate in rates:
        workload = setup.workloads(rate)[0]
        for name in names:
            clocks = [one_run(setup, workload, name, args.server_trees)
                      for _ in range(args.repeats)]
            spec = _per_iteration(clocks, "speculative")
            on_path = _per_iteration(clocks, "speculative", "critical")
            overlapped = _per_iteration(clocks, "speculative", "overlapped")
            plain = _per_iteration(clocks, "plain")
            clock = clocks[0]
            share = len(clock.speculative) / max(len(clock.speculative) + len(clock.plain), 1)
            print(f"| {name} | {rate:g} | {_mean(clock.running):.1f} | {share:.2f} | {spec:.3f} "
                  f"| {on_path:.3f} | {overlapped:.3f} | {plain:.3f} |")  # fmt: skip
            if name == "adaserve":
                critical.append(on_path)
                total.append(spec)
    print(f"adaserve_policy_ms_per_speculative_iteration={max(total):.3f}")
    print(f"adaserve_critical_path_ms_per_speculative_iteration={max(critical):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
