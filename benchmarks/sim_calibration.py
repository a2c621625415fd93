"""Does adaserve's online acceptance calibration hold when the draft's probabilities lie?

    python benchmarks/sim_calibration.py [--preset a100x4-llama70b] [--rate 4] [--requests 400]

The simulator's acceptance model decides what the target accepts given the draft's path
probabilities: the measured Qwen pair (`acceptance.DEFAULT`), and two deliberately wrong drafts
made from it, an over-confident one (the target accepts only 0.6 x what the draft's
probability says) and an under-confident one (it accepts sqrt of it). adaserve runs each
workload through the server's own policy code. Per speculative iteration, its statistics take
the accepted draft tokens that the raw path probabilities predict, that the calibrated ones
predict (with the calibration as it stood before that iteration's outcome), and that were
observed; the table sums them over every iteration after the first `--warmup`, and shows
the server's own decayed ratio (`/server_info`, about the last 50 iterations: the run's
draining tail, a handful of requests) beside it.
Last line: calibrated_over_observed_worst=<the calibrated ratio (after warm-up) farthest from 1>.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from sgl_adaspec.scheduler.cost_model import knee_budget
from sgl_adaspec.scheduler.slo_config import DEFAULT_SLO_CONFIG, load_slo_config
from sgl_adaspec.sim.acceptance import DEFAULT
from sgl_adaspec.sim.engine import EngineConfig, simulate
from sgl_adaspec.sim.latency import get_preset
from sgl_adaspec.sim.policies import make_policy
from sgl_adaspec.sim.workload import poisson_workload


def accept_curves() -> dict[str, tuple[tuple[float, ...], tuple[float, ...]]]:
    p = np.linspace(0.0, 1.0, 21)
    measured = DEFAULT.calibrate(p)
    return {
        "measured": (tuple(p), tuple(measured)),
        "over-confident draft (0.6x)": (tuple(p), tuple(0.6 * measured)),
        "under-confident draft (sqrt)": (tuple(p), tuple(np.sqrt(measured))),
    }


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="a100x4-llama70b")
    parser.add_argument("--rate", type=float, default=4.0, help="requests per second")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=50, help="speculative iterations left out")
    args = parser.parse_args()
    latency = get_preset(args.preset)
    slo_config = load_slo_config(DEFAULT_SLO_CONFIG)
    baseline = latency.baseline_tpot_ms
    budget = knee_budget(latency.verify_profile())
    workload = poisson_workload(args.rate, args.requests, slo_config, baseline, args.seed)
    print(f"{args.preset}, {args.requests} requests at {args.rate:g} req/s, adaserve")
    print(f"{'acceptance':<30} {'raw/obs':>8} {'calib/obs':>10} {'decayed':>8} {'attain':>7}")
    worst = 1.0
    for name, (p, accept) in accept_curves().items():
        acceptance = DEFAULT.with_calibration(name, p, accept)
        policy = make_policy("adaserve", budget, baseline)
        stats = policy.policy.stats
        sums = []  # (raw, calibrated, observed) per speculative iteration
        record = stats.observe_calibration

        def observe(raw, calibrated, observed, record=record, sums=sums):
            sums.append((raw, calibrated, observed))
            record(raw, calibrated, observed)

        stats.observe_calibration = observe
        result = simulate(workload, latency, acceptance, policy, args.seed, EngineConfig())
        raw, calibrated, observed = np.array(sums[args.warmup :]).sum(axis=0)
        decayed = stats.as_dict()["acceptance_calibrated_over_observed"]
        ratio = calibrated / observed
        print(
            f"{name:<30} {raw / observed:>8.3f} {ratio:>10.3f} {_num(decayed):>8} "
            f"{result.met.mean():7.3f}"
        )
        if abs(ratio - 1.0) > abs(worst - 1.0):
            worst = ratio
    print(f"calibrated_over_observed_worst={worst:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
