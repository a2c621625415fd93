"""Data-parallel replicas in the simulator: SGLang's dispatch (round robin, total requests) against
the plugin's SLO-aware rule (`scheduler.dp_dispatch.choose_replica`, the server's own code), at
replica counts this machine cannot run as servers.

    python -m sgl_adaspec.sim --experiment dp-dispatch --replicas 8 [--rates 6,7,8] ...

Rates are per replica: N replicas at rate r see N * r requests per second (and N times
`--num-requests`). Every replica runs the first of `--policies` (default adaserve). The
server's replicas report per-token time from their own latency fits; here the dispatcher reads
the simulator's latency model at each replica's batch and contexts.
"""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from functools import partial

import numpy as np

from sgl_adaspec.scheduler.dp_dispatch import ReplicaLoad, choose_replica
from sgl_adaspec.sim.engine import Instance, simulate_replicas
from sgl_adaspec.sim.experiments import SweepConfig, SweepSetup, mean_summary, summarize
from sgl_adaspec.sim.policies import make_policy

METHODS = ("round_robin", "total_requests", "slo")
GAIN_METRIC = "sim_dp_slo_dispatch_tight_attainment_gain"


def replica_load(instance: Instance) -> ReplicaLoad:
    """What the SLO-aware dispatcher knows of a replica: requests in flight, their TPOT SLOs,
    and its per-token time with 1..n+1 requests at their mean context."""
    workload = instance.workload
    ids = instance.requests
    slos = workload.tpot_slo_ms[ids]
    if ids.size:
        context = float((workload.prompt_tokens[ids] + instance.result.committed[ids]).mean())
    else:
        context = float(workload.prompt_tokens.mean())
    curve = tuple(instance.latency.verify_ms(k, k * context) for k in range(1, ids.size + 2))
    return ReplicaLoad(int(ids.size), tuple(float(s) for s in slos[np.isfinite(slos)]), curve)


class Dispatcher:
    """One dispatch method over the simulated replicas (`engine.Dispatch`)."""

    def __init__(self, method: str) -> None:
        if method not in METHODS:
            raise ValueError(f"unknown dispatch method {method!r}; choose from {METHODS}")
        self.method = method
        self.turn = 0

    def __call__(self, instances: list[Instance], request: int) -> int:
        if self.method == "round_robin":
            self.turn += 1
            return (self.turn - 1) % len(instances)
        if self.method == "total_requests":
            return min(range(len(instances)), key=lambda i: instances[i].requests.size)
        slo = float(instances[0].workload.tpot_slo_ms[request])
        loads = [replica_load(instance) for instance in instances]
        return choose_replica(loads, slo if np.isfinite(slo) else None)



def replica_runs(setup: SweepSetup, workloads: list, policy: str, replicas: int, dispatch):
    """One summary per seed of `workloads`: `replicas` fresh instances of `policy` behind a
    fresh `dispatch()` each run."""
    runs = []
    for workload, (_, engine_seed) in zip(workloads, setup.seeds):
        policies = [make_policy(policy, setup.budget, setup.baseline) for _ in range(replicas)]
        result = simulate_replicas(
            workload, setup.latency, setup.acceptance, policies, dispatch(), int(engine_seed),
            setup.engine,
        )  # fmt: skip
        runs.append(summarize(result))
    return runs

def run_dp_dispatch(config: SweepConfig, progress=print) -> dict:
    """Per rate (per replica) and method: the mean over seeds of `summarize`."""
    replicas = config.replicas
    scaled = replace(config, num_requests=config.num_requests * replicas)
    setup = SweepSetup.of(scaled)
    policy = config.policies[0]
    rows = []
    for rate in config.rates_rps:
        workloads = setup.workloads(rate * replicas)
        for method in METHODS:
            started = time.perf_counter()
            runs = replica_runs(setup, workloads, policy, replicas, partial(Dispatcher, method))
            row = {"rate_rps": rate, "method": method, **mean_summary(runs)}
            rows.append(row)
            progress(
                f"  rate {rate:g} rps/replica {method:<15} attainment {row['attainment']:.3f} "
                + " ".join(f"{c} {v['attainment']:.3f}" for c, v in row["classes"].items())
                + f" ({time.perf_counter() - started:.1f} s)"
            )
    tight = min(rows[0]["classes"], key=lambda c: rows[0]["classes"][c]["tpot_slo_ms"])
    top = [row for row in rows if row["rate_rps"] == max(config.rates_rps)]
    by_method = {row["method"]: row["classes"][tight]["attainment"] for row in top}
    gain = by_method["slo"] - max(by_method["round_robin"], by_method["total_requests"])
    return {
        "experiment": "dp-dispatch",
        "config": asdict(config),
        "policy": policy,
        "tight_class": tight,
        "rows": rows,
        GAIN_METRIC: gain,
    }


def format_table(sweep: dict) -> str:
    classes = list(sweep["rows"][0]["classes"])
    head = f"{'rate/replica':>12} {'method':<15} {'all':>7}" + "".join(f"{c:>14}" for c in classes)
    lines = [head]
    for row in sweep["rows"]:
        cells = "".join(f"{row['classes'][c]['attainment']:>14.3f}" for c in classes)
        lines.append(f"{row['rate_rps']:>12g} {row['method']:<15} {row['attainment']:>7.3f}{cells}")
    return "\n".join(lines)


def dp_dispatch_main(config: SweepConfig) -> dict:
    print(
        f"dp-dispatch: {config.replicas} replicas of {config.policies[0]} on {config.preset}, "
        f"{config.num_requests * config.replicas} requests per run, {config.repeats} seeds"
    )
    sweep = run_dp_dispatch(config)
    print(format_table(sweep))
    print(f"tight class: {sweep['tight_class']} (attainment at the highest rate decides the gain)")
    print(f"{GAIN_METRIC}={sweep[GAIN_METRIC]:.3f}")
    return sweep
