"""Data-parallel replicas in the simulator (`sim/replicas.py`, `engine.simulate_replicas`):
every request served once on one replica, the dispatch methods' choices, and one replica
behaving as the lone instance."""

from __future__ import annotations

import numpy as np
import pytest

from sgl_adaspec.scheduler.cost_model import knee_budget
from sgl_adaspec.scheduler.slo_config import DEFAULT_SLO_CONFIG, load_slo_config
from sgl_adaspec.sim.acceptance import SYNTHETIC_DEFAULT
from sgl_adaspec.sim.engine import EngineConfig, Instance, SimResult, simulate, simulate_replicas
from sgl_adaspec.sim.latency import get_preset
from sgl_adaspec.sim.policies import make_policy
from sgl_adaspec.sim.replicas import METHODS, Dispatcher, replica_load
from sgl_adaspec.sim.workload import poisson_workload

PRESET = "h100-llama8b"


def setup(rate, num_requests, seed=0):
    latency = get_preset(PRESET)
    slo = load_slo_config(DEFAULT_SLO_CONFIG)
    workload = poisson_workload(rate, num_requests, slo, latency.baseline_tpot_ms, seed)
    budget = knee_budget(latency.verify_profile())
    return latency, workload, lambda name: make_policy(name, budget, latency.baseline_tpot_ms)


def test_one_replica_is_the_lone_instance():
    latency, workload, policy = setup(30.0, 20)
    alone = simulate(workload, latency, SYNTHETIC_DEFAULT, policy("adaserve"), 3)
    one = simulate_replicas(
        workload, latency, SYNTHETIC_DEFAULT, [policy("adaserve")], Dispatcher("slo"), 3
    )
    assert np.array_equal(alone.finish_s, one.finish_s)
    assert alone.iterations == one.iterations


@pytest.mark.parametrize("method", METHODS)
def test_every_request_is_served_once_on_some_replica(method):
    latency, workload, policy = setup(60.0, 30)
    dispatcher = Dispatcher(method)
    chosen = []

    def recording(instances, request):
        chosen.append(dispatcher(instances, request))
        return chosen[-1]

    result = simulate_replicas(
        workload, latency, SYNTHETIC_DEFAULT, [policy("static") for _ in range(3)],
        recording, 0, EngineConfig(max_running_requests=16),
    )  # fmt: skip
    assert (result.finished_count == 1).all()
    assert (result.committed == workload.output_tokens).all()
    assert len(chosen) == workload.num_requests and set(chosen) == {0, 1, 2}
    if method == "round_robin":
        assert chosen[:6] == [0, 1, 2, 0, 1, 2]


def instance(latency, workload, policy, running=(), waiting=()):
    inst = Instance(
        workload, latency, SYNTHETIC_DEFAULT, policy, np.random.default_rng(0), EngineConfig(),
        result=SimResult(
            "x", workload, *(np.zeros(workload.num_requests) for _ in range(2)),
            committed=np.ones(workload.num_requests, dtype=np.int64),
            finished_count=np.zeros(workload.num_requests, dtype=np.int64),
        ),
        alpha=np.ones(1), beta=np.ones(1),
    )  # fmt: skip
    inst.running = np.array(running, dtype=np.int64)
    inst.waiting.extend(waiting)
    return inst


def test_the_views_and_choices_of_the_dispatch_methods():
    latency, workload, policy = setup(30.0, 10)
    busy = instance(latency, workload, policy("none"), running=[0, 1, 2], waiting=[3])
    idle = instance(latency, workload, policy("none"))
    load = replica_load(busy)
    assert load.requests == 4 and len(load.tpot_ms_by_requests) == 5
    finite = workload.tpot_slo_ms[[0, 1, 2, 3]]
    assert sorted(load.slos_ms) == sorted(finite[np.isfinite(finite)].tolist())
    # The per-token time grows with the batch.
    assert load.tpot_ms_by_requests[0] < load.tpot_ms_by_requests[-1]
    assert Dispatcher("total_requests")([busy, idle], 5) == 1
    assert Dispatcher("slo")([busy, idle], 5) == 1  # the empty replica has the larger margin
    with pytest.raises(ValueError, match="unknown dispatch"):
        Dispatcher("random")
