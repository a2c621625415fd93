"""`python -m sgl_adaspec.sim [--experiment rps-sweep|adaserve-grid|trace|dp-dispatch|fleet]
[options]`; see docs/simulator.md.

Defaults live in `experiments.SweepConfig`; flags left out keep them.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

from sgl_adaspec.bench.traces import TRACE_FORMATS, load_trace
from sgl_adaspec.flags import comma_floats
from sgl_adaspec.sim.acceptance import DEFAULT, NAMED, resolve
from sgl_adaspec.sim.experiments import SweepConfig, rps_sweep_main
from sgl_adaspec.sim.latency import PRESETS
from sgl_adaspec.sim.policies import EXTRA_POLICY_NAMES, POLICY_NAMES

EXPERIMENTS = ("rps-sweep", "adaserve-grid", "trace", "dp-dispatch", "fleet")


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _counts(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")


def parse_args(argv: list[str]) -> tuple[str, SweepConfig]:
    parser = argparse.ArgumentParser(prog="python -m sgl_adaspec.sim", description=__doc__)
    parser.add_argument("--experiment", choices=EXPERIMENTS, default="rps-sweep")
    parser.add_argument("--preset", choices=sorted(PRESETS), help="latency model")
    parser.add_argument("--rates", type=comma_floats, dest="rates_rps", help="e.g. 1,2,4,8 (req/s)")
    parser.add_argument("--num-requests", type=int, help="requests per run")
    parser.add_argument("--repeats", type=int, help="seeds per rate (the table shows the mean)")
    known = ",".join(POLICY_NAMES + EXTRA_POLICY_NAMES)
    parser.add_argument("--policies", type=_names, help=f"comma-separated, from {known}")
    parser.add_argument("--seed", type=int)
    parser.add_argument(
        "--acceptance",
        help=f"acceptance model: a JSON path or one of {', '.join(NAMED)} "
        f"(default: {DEFAULT.name}, measured)",
    )
    parser.add_argument("--out", dest="out_dir", help="output folder (JSON, PNG)")
    parser.add_argument("--max-running-requests", type=int)
    parser.add_argument("--trace", help="trace experiment: AdaServe JSON, Azure or timestamps CSV")
    parser.add_argument(
        "--trace-format", choices=("auto", *TRACE_FORMATS), help="trace experiment (default auto)"
    )
    parser.add_argument(
        "--time-compression", type=float, help="trace experiment: arrivals divided by this"
    )
    parser.add_argument(
        "--relative-slo-scale",
        type=float,
        help="trace experiment: every baseline-relative SLO at this multiple of the baseline",
    )
    parser.add_argument(
        "--replicas",
        type=_counts,
        help="dp-dispatch: data-parallel replicas; fleet: replica counts, e.g. 8,32 (rates and "
        "--num-requests per replica in both)",
    )
    parser.add_argument(
        "--server-replicas", type=int, help="fleet: replicas per server for the two-level methods"
    )
    parser.add_argument(
        "--charge-policy-time",
        type=float,
        dest="policy_time_scale",
        metavar="SCALE",
        help="charge each policy's own wall time per iteration (measured on this host, times "
        "SCALE: 0.5 for a host CPU twice as fast) to the simulated clock, as a server pays it; "
        "results then vary from run to run (default 0: not charged)",
    )
    parser.add_argument(
        "--charge-critical-path",
        choices=("decide", "past-draft"),
        help="with --charge-policy-time: charge only each policy's decision between the draft "
        "and the verify (its plan and observe run beside the device's work under SGLang's "
        "overlap scheduler): all of it (decide), or what outlasts the draft's device time "
        "(past-draft: a decision that reads nothing of the device runs beside the draft)",
    )
    parser.add_argument(
        "--charge-decision-ms",
        type=float,
        dest="decision_ms",
        metavar="MS",
        help="with --charge-critical-path: charge each decided iteration's decision at MS "
        "(times the scale) instead of the host's measured time: repeatable runs that ask what a "
        "decision of that length would cost",
    )
    parser.add_argument(
        "--observe-lag",
        type=int,
        choices=(0, 1),
        help="iterations a policy waits for an iteration's outcome: 1 as under SGLang's overlap "
        "scheduler on a GPU (the next iteration is planned before this one's outcome is read), "
        "0 at once (default: 1 with --charge-critical-path, else 0)",
    )
    args = vars(parser.parse_args(argv))
    experiment = args.pop("experiment")
    given = {k: v for k, v in args.items() if v is not None}
    if experiment in ("trace", "fleet") and "trace" not in given:
        parser.error(f"--experiment {experiment} needs --trace PATH")
    if "replicas" in given:  # one count for dp-dispatch, a list for the fleet
        counts = given.pop("replicas")
        if experiment == "fleet":
            given["fleet_replicas"] = counts
        elif len(counts) == 1:
            given["replicas"] = counts[0]
        else:
            parser.error(f"--experiment {experiment} takes one --replicas count, got {counts}")
    try:
        config = dataclasses.replace(SweepConfig(), **given)
        _check_inputs(experiment, config)
    except (ValueError, OSError) as exc:
        parser.error(str(exc))
    return experiment, config


def _check_inputs(experiment: str, config: SweepConfig) -> None:
    """The acceptance model and the trace read before anything runs, so a missing or malformed
    file is one error line rather than a traceback minutes in."""
    resolve(config.acceptance)
    if experiment in ("trace", "fleet"):
        load_trace(Path(config.trace), config.trace_format)
    if experiment == "fleet":
        from sgl_adaspec.sim.fleet import fleet_methods

        for replicas in config.fleet_replicas:
            fleet_methods(replicas, config.server_replicas)  # servers split the replicas evenly


def main(argv: list[str] | None = None) -> int:
    experiment, config = parse_args(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(1)  # tiny tensors; leave the other cores alone
    if experiment == "rps-sweep":
        rps_sweep_main(config)
    elif experiment == "adaserve-grid":
        from sgl_adaspec.sim.grid import grid_main

        grid_main(config)
    elif experiment == "trace":
        from sgl_adaspec.sim.experiments import trace_main

        trace_main(config)
    elif experiment == "dp-dispatch":
        from sgl_adaspec.sim.replicas import dp_dispatch_main

        if config.policies == SweepConfig().policies:
            config = dataclasses.replace(config, policies=("adaserve",))
        dp_dispatch_main(config)
    elif experiment == "fleet":
        from sgl_adaspec.sim.fleet import fleet_main

        if config.policies == SweepConfig().policies:
            config = dataclasses.replace(config, policies=("adaserve",))
        fleet_main(config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
