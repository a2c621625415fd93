"""A fleet in the simulator: 8-32 replicas behind a router, on an AdaServe trace. Does the
SLO-aware dispatch (`scheduler.dp_dispatch.choose_replica`, the server's own rule) still beat
SLO-blind routing at that scale, and what is left of it when a router spreads requests over
servers that each dispatch among their own replicas?

    python -m sgl_adaspec.sim --experiment fleet --trace adaserve_rps4.0_ol256.json \
        --replicas 8,32 --rates 8,10 --num-requests 100 [--server-replicas 4]

Methods (`fleet_methods`), every replica running the first of `--policies` (default adaserve):
- `round_robin`, `least_load`: a router that knows no SLO sends each request to a replica, in
  turn or to the one with the fewest requests in flight (sglang-router's round robin; its
  least-load is SGLang's `total_requests`);
- `slo`: one controller over every replica, dispatching with `choose_replica`;
- `round_robin+slo`, `least_load+slo`: two levels. Servers of `--server-replicas` replicas each
  (`--dp k`); the router picks a server by its policy (least-load: fewest requests in flight
  over the server's replicas), and the server's controller picks among its own replicas with
  `choose_replica`.

The trace's arrivals, classes, SLOs and lengths (`trace_replay.trace_workload`) are scaled to
the fleet (`fleet_workload`): rates and `--num-requests` are per replica, as in dp-dispatch
(the rate replaces `--time-compression`).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import numpy as np

from sgl_adaspec.sim.engine import Instance
from sgl_adaspec.sim.experiments import SweepConfig, SweepSetup, mean_summary
from sgl_adaspec.sim.replicas import Dispatcher, replica_runs
from sgl_adaspec.sim.workload import WorkloadArrays

ROUTERS = ("round_robin", "least_load")
SLO_BLIND = ROUTERS  # the router alone, one replica per server
GAIN_METRIC = "sim_fleet_slo_dispatch_attainment_gain_points"


def fleet_workload(
    trace: WorkloadArrays, num_requests: int, rate_rps: float, seed: int
) -> WorkloadArrays:
    """`num_requests` requests at a mean `rate_rps`, from copies of `trace` at independent
    phases: each copy's arrivals shifted by a random offset, wrapped around the trace's span
    (its bursts kept, in a different place), the copies merged. A fleet serves many such
    streams at once; one copy (a random stretch of the trace) where the trace is long enough.
    Time is then scaled to the rate, the first arrival at 0."""
    if num_requests < 1 or not rate_rps > 0:
        raise ValueError(f"need >= 1 request and a rate > 0, got {num_requests}, {rate_rps}")
    length = trace.num_requests
    start = trace.arrival_s - trace.arrival_s[0]
    # One mean gap past the last arrival, so the wrapped-around first arrival keeps a gap.
    span = float(start[-1]) * length / max(length - 1, 1) if start[-1] > 0 else 1.0
    copies = math.ceil(num_requests / length)
    offsets = np.random.default_rng(seed).uniform(0.0, span, copies)
    arrival = np.concatenate([(start + offset) % span for offset in offsets])
    order = np.argsort(arrival, kind="stable")[:num_requests]
    source = order % length  # the trace row behind each request
    stream_rate = copies * length / span
    arrival = (arrival[order] - arrival[order[0]]) * stream_rate / rate_rps
    return WorkloadArrays(
        trace.class_names, arrival, trace.class_index[source], trace.prompt_tokens[source],
        trace.output_tokens[source], trace.tpot_slo_ms[source],
    )  # fmt: skip


@dataclass(frozen=True)
class FleetMethod:
    """How a request reaches a replica: the router picks a server of `server_replicas`
    consecutive replicas (`router` None: one server of them all, nothing to pick), the server
    its replica (`choose_replica`; a one-replica server has nothing to choose)."""

    name: str
    router: str | None
    server_replicas: int

    def __post_init__(self) -> None:
        if self.router not in (None, *ROUTERS):
            raise ValueError(f"unknown router {self.router!r}; choose from {ROUTERS}")
        if self.server_replicas < 1:
            raise ValueError(f"server_replicas must be >= 1, got {self.server_replicas}")


def fleet_methods(replicas: int, server_replicas: int) -> tuple[FleetMethod, ...]:
    """The SLO-blind routers, the SLO-aware dispatch over all replicas, and both levels (left
    out where servers of `server_replicas` would be one replica, or all of them)."""
    if replicas % server_replicas:
        raise ValueError(f"{replicas} replicas do not split into servers of {server_replicas}")
    methods = [FleetMethod(router, router, 1) for router in ROUTERS]
    methods.append(FleetMethod("slo", None, replicas))
    if 1 < server_replicas < replicas:
        methods += [FleetMethod(f"{r}+slo", r, server_replicas) for r in ROUTERS]
    return tuple(methods)


class FleetDispatcher:
    """One fleet method over the simulated replicas (`engine.Dispatch`)."""

    def __init__(self, method: FleetMethod) -> None:
        self.method = method
        self.turn = 0
        self.server_dispatch = Dispatcher("slo")  # the server's controller: choose_replica

    def server(self, instances: list[Instance]) -> int:
        """The router's choice of server (index)."""
        size = self.method.server_replicas
        servers = len(instances) // size
        if self.method.router is None or servers == 1:
            return 0
        if self.method.router == "round_robin":
            self.turn += 1
            return (self.turn - 1) % servers
        in_flight = [
            sum(inst.requests.size for inst in instances[s * size : (s + 1) * size])
            for s in range(servers)
        ]
        return min(range(servers), key=in_flight.__getitem__)  # ties: the first, as min does

    def __call__(self, instances: list[Instance], request: int) -> int:
        size = self.method.server_replicas
        if len(instances) % size:
            raise ValueError(f"{len(instances)} replicas do not split into servers of {size}")
        first = self.server(instances) * size
        if size == 1:
            return first
        return first + self.server_dispatch(instances[first : first + size], request)


def run_fleet(config: SweepConfig, progress=print) -> dict:
    """Per replica count, rate (per replica) and method: the mean over seeds of `summarize`,
    and each row's gain: attainment less the best SLO-blind router's (points)."""
    from sgl_adaspec.bench.traces import load_trace
    from sgl_adaspec.sim.trace_replay import trace_workload

    if config.trace is None:
        raise ValueError("the fleet experiment needs --trace PATH (an AdaServe trace)")
    setup = SweepSetup.of(config)
    trace = trace_workload(
        load_trace(Path(config.trace), config.trace_format), setup.slo_config, setup.baseline,
        relative_slo_scale=config.relative_slo_scale, seed=config.seed,
    )  # fmt: skip
    policy = config.policies[0]
    rows = []
    for replicas in config.fleet_replicas:
        for rate in config.rates_rps:
            workloads = [
                fleet_workload(trace, config.num_requests * replicas, rate * replicas, int(w))
                for w, _ in setup.seeds
            ]
            point = []
            for method in fleet_methods(replicas, config.server_replicas):
                started = time.perf_counter()
                runs = replica_runs(
                    setup, workloads, policy, replicas, partial(FleetDispatcher, method)
                )
                row = {"replicas": replicas, "rate_rps": rate, "method": method.name}
                row.update(mean_summary(runs))
                point.append(row)
                progress(
                    f"  {replicas} replicas, {rate:g} rps/replica, {method.name:<17} attainment "
                    f"{row['attainment']:.3f} ({time.perf_counter() - started:.1f} s)"
                )
            blind = max(row["attainment"] for row in point if row["method"] in SLO_BLIND)
            for row in point:
                row["gain_points"] = 100 * (row["attainment"] - blind)
            rows.extend(point)
    top = [
        row for row in rows
        if row["replicas"] == max(config.fleet_replicas) and row["rate_rps"] == max(config.rates_rps)
    ]  # fmt: skip
    return {
        "experiment": "fleet",
        "config": asdict(config),
        "policy": policy,
        "rows": rows,
        GAIN_METRIC: next(row["gain_points"] for row in top if row["method"] == "slo"),
    }


def format_table(sweep: dict) -> str:
    """One row per replica count, rate and method: attainment (all, per class), goodput, and
    the gain over the best SLO-blind router (points)."""
    classes = list(sweep["rows"][0]["classes"])
    head = f"{'replicas':>8} {'rate':>5} {'method':<17} {'all':>6}"
    head += "".join(f"{c[:13]:>14}" for c in classes) + f"{'goodput':>10}{'gain':>7}"
    lines = [head]
    for row in sweep["rows"]:
        cells = "".join(f"{row['classes'][c]['attainment']:>14.3f}" for c in classes)
        lines.append(
            f"{row['replicas']:>8} {row['rate_rps']:>5g} {row['method']:<17} "
            f"{row['attainment']:>6.3f}{cells}{row['goodput_tok_s']:>10.0f}"
            f"{row['gain_points']:>+7.1f}"
        )
    return "\n".join(lines)


def fleet_main(config: SweepConfig) -> dict:
    """Run the fleet experiment, print the table, write the JSON, the SLO dispatch's gain last."""
    print(
        f"fleet: {','.join(map(str, config.fleet_replicas))} replicas of {config.policies[0]} "
        f"on {config.preset}, trace {config.trace}, {config.num_requests} requests per replica, "
        f"servers of {config.server_replicas} for two levels, {config.repeats} seeds; simulated"
    )
    sweep = run_fleet(config)
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / f"fleet_{Path(config.trace).stem}.json"
    json_path.write_text(json.dumps(sweep, indent=1, default=float) + "\n")
    print(format_table(sweep))
    print("rate: requests/s per replica; goodput: tokens/s of the fleet; gain: attainment less ")
    print("the best SLO-blind router's at that point (points)")
    print(f"wrote {json_path}")
    print(f"{GAIN_METRIC}={sweep[GAIN_METRIC]:.2f}")
    return sweep
