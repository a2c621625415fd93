"""Torch calls per decision: what a policy's `decide` dispatches between the draft and the
verify, each a kernel launch on a GPU and 2-5 us of host time on the project's CPU.

    python benchmarks/decision_calls.py [--preset h100-llama8b] [--rate 48] [--requests 200]
                                        [--policies adaserve,tetris] [--seed 0]
                                        [--server-trees]

The simulator drives each policy through the server's calls (`sim.policies.ServerPolicy`) on
the same workload; a `TorchFunctionMode` counts the torch functions and tensor methods called
inside `decide` (attribute reads such as `.shape` left out). Deterministic: the count does not
depend on the host. `--server-trees`: the simulator's trees handed over as the SGLang adapter
hands its own on a GPU server, device tensors (`host_reads.on_device`: no shortcut reads them)
with their depths and no layout promise, so a policy that narrows them to a shape searches
for it (they hold no leaf off the beam, as SGLang's do; a count of calls barely depends on
that). Prints calls per decision per policy; last line
adaserve_torch_calls_per_decision=<x>.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import torch
from torch.overrides import TorchFunctionMode

from sgl_adaspec.sim.experiments import SweepConfig, SweepSetup
from sgl_adaspec.sim.policies import SERVER_POLICY_NAMES, make_policy
from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.host_reads import on_device


class CallCounter(TorchFunctionMode):
    """Counts torch calls made while it is entered (property reads not counted)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if "__get__" not in getattr(func, "__qualname__", ""):
            self.calls += 1
        return func(*args, **(kwargs or {}))


def on_a_server(cands: Candidates) -> Candidates:
    """`cands` handed over as the SGLang adapter hands its own on a GPU: device tensors,
    depths known (it reads them from SGLang's positions), no layout promise."""
    return Candidates.trusted(
        *(on_device(t) for t in (cands.tokens, cands.parents, cands.path_prob, cands.valid)),
        depth=on_device(cands.depth),
    )


def calls_per_decision(
    setup: SweepSetup, workload, name: str, server_trees: bool = False
) -> float:
    counter, decisions = CallCounter(), [0]

    def policy():
        adapter = make_policy(name, setup.budget, setup.baseline)
        decide = adapter.policy.decide

        def counted(it):
            decisions[0] += 1
            if server_trees:
                it = dataclasses.replace(it, cands=on_a_server(it.cands))
            with counter:
                return decide(it)

        adapter.policy.decide = counted
        return adapter

    setup.run(policy, [workload])
    return counter.calls / max(decisions[0], 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="h100-llama8b")
    parser.add_argument("--rate", type=float, default=48.0)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--policies", default="adaserve,tetris")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server-trees", action="store_true")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.policies.split(",") if n.strip()]
    known = SERVER_POLICY_NAMES + ("adaserve",)
    if "adaserve" not in names or any(n not in known for n in names):
        parser.error(f"--policies: adaserve and any of {', '.join(SERVER_POLICY_NAMES)}")
    torch.set_num_threads(1)
    config = SweepConfig(
        preset=args.preset, rates_rps=(args.rate,), num_requests=args.requests, repeats=1,
        seed=args.seed, policies=("adaserve",),
    )  # fmt: skip
    setup = SweepSetup.of(config)
    workload = setup.workloads(args.rate)[0]
    counts = {
        name: calls_per_decision(setup, workload, name, args.server_trees) for name in names
    }
    trees = ", server trees" if args.server_trees else ""
    for name, calls in counts.items():
        print(
            f"{name}: {calls:.1f} torch calls per decision "
            f"({args.preset}, {args.rate:g} req/s{trees})"
        )
    print(f"adaserve_torch_calls_per_decision={counts['adaserve']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
