"""How much time adaserve's own calls take per iteration, on the server's code path.

    python benchmarks/policy_overhead.py [--preset a100x4-llama70b] [--rates 2,8]
                                         [--requests 200] [--repeats 3] [--seed 0]
                                         [--policies adaserve,tetris]

The simulator drives the policy through the calls the SGLang adapter makes (`draft_shape`,
`keep_draft_warm`, `decide`, `observe`, `draft_prefills`; `sim.policies.ServerPolicy`), and
this script times those calls alone with a wall clock, single-threaded: the simulator's own
work (the draft trees, the accept walk) is left out. On a server the same time sits on the
scheduler's critical path of every iteration. Per rate: the policy's ms per speculative and
per plain iteration (mean over the run's iterations, median over `--repeats` runs of the same
workload), the mean running requests, and the share of iterations that speculated; each
policy of `--policies` (server policies: adaserve, tetris, adaspec, faser, dropin) on the same
workload, so adaserve's time reads beside another policy's on the same host.
Last line: adaserve_policy_ms_per_speculative_iteration=<the largest over rates>.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from sgl_adaspec.sim.experiments import SweepConfig, SweepSetup
from sgl_adaspec.sim.policies import SERVER_POLICY_NAMES, make_policy

TIMED_CALLS = ("draft_shape", "keep_draft_warm", "decide", "observe", "draft_prefills")


class Clock:
    """Wall time spent in the policy's timed calls, charged to the iteration they belong to."""

    def __init__(self, policy) -> None:
        self.pending_ms = 0.0
        self.speculative: list[float] = []
        self.plain: list[float] = []
        self.running: list[int] = []
        for name in TIMED_CALLS:
            setattr(policy, name, self._timed(getattr(policy, name), name == "observe"))

    def _timed(self, call, ends_iteration: bool):
        def timed(*args, **kwargs):
            started = time.perf_counter()
            result = call(*args, **kwargs)
            self.pending_ms += 1e3 * (time.perf_counter() - started)
            if ends_iteration:
                outcome = args[0]
                (self.speculative if outcome.speculated else self.plain).append(self.pending_ms)
                self.running.append(len(outcome.rids))
                self.pending_ms = 0.0
            return result

        return timed


def one_run(setup: SweepSetup, workload, name: str = "adaserve") -> Clock:
    clocks = []

    def policy():
        adapter = make_policy(name, setup.budget, setup.baseline)
        clocks.append(Clock(adapter.policy))
        return adapter

    setup.run(policy, [workload])
    return clocks[0]


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="a100x4-llama70b")
    parser.add_argument("--rates", default="2,8", help="requests per second, comma-separated")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policies", default="adaserve", help="comma-separated; adaserve first")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.policies.split(",") if n.strip()]
    if not names or names[0] != "adaserve" or any(n not in SERVER_POLICY_NAMES + ("adaserve",)
                                                    for n in names):  # fmt: skip
        parser.error(f"--policies: adaserve first, then any of {', '.join(SERVER_POLICY_NAMES)}")
    torch.set_num_threads(1)
    rates = tuple(float(r) for r in args.rates.split(","))
    config = SweepConfig(
        preset=args.preset, rates_rps=rates, num_requests=args.requests, repeats=1,
        seed=args.seed, policies=("adaserve",),
    )  # fmt: skip
    setup = SweepSetup.of(config)
    print(f"each policy's own calls per iteration, {args.preset}, {args.requests} requests, "
          f"median of {args.repeats} runs")  # fmt: skip
    print("| policy | rate | running (mean) | speculative share | ms per speculative | ms per plain |")
    print("|---|---|---|---|---|---|")
    per_rate = []
    for rate in rates:
        workload = setup.workloads(rate)[0]
        for name in names:
            clocks = [one_run(setup, workload, name) for _ in range(args.repeats)]
            spec = statistics.median(_mean(c.speculative) for c in clocks)
            plain = statistics.median(_mean(c.plain) for c in clocks)
            clock = clocks[0]
            share = len(clock.speculative) / max(len(clock.speculative) + len(clock.plain), 1)
            print(f"| {name} | {rate:g} | {_mean(clock.running):.1f} | {share:.2f} | {spec:.3f} "
                  f"| {plain:.3f} |")  # fmt: skip
            if name == "adaserve":
                per_rate.append(spec)
    print(f"adaserve_policy_ms_per_speculative_iteration={max(per_rate):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
