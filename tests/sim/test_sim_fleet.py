"""The fleet experiment (`sim/fleet.py`): the trace scaled to the fleet, the routers' and the
two levels' choices, determinism, and the CLI's table and last line."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from sgl_adaspec.bench.traces import TraceRow
from sgl_adaspec.scheduler.cost_model import knee_budget
from sgl_adaspec.scheduler.dp_dispatch import choose_replica
from sgl_adaspec.scheduler.slo_config import DEFAULT_SLO_CONFIG, load_slo_config
from sgl_adaspec.sim import __main__ as sim_cli
from sgl_adaspec.sim.acceptance import SYNTHETIC_DEFAULT
from sgl_adaspec.sim.engine import EngineConfig, simulate_replicas
from sgl_adaspec.sim.fleet import (
    GAIN_METRIC,
    FleetDispatcher,
    FleetMethod,
    fleet_methods,
    fleet_workload,
)
from sgl_adaspec.sim.latency import get_preset
from sgl_adaspec.sim.policies import make_policy
from sgl_adaspec.sim.replicas import Dispatcher, replica_load
from sgl_adaspec.sim.trace_replay import mean_rate_rps, trace_workload

PRESET = "h100-llama8b"
SLO_CONFIG = load_slo_config(DEFAULT_SLO_CONFIG)


def adaserve_like_trace(num: int, seed: int = 0) -> list[TraceRow]:
    """Bursty arrivals (gamma gaps, CV 2) of AdaServe's three classes."""
    rng = np.random.default_rng(seed)
    arrival = np.concatenate([[0.0], np.cumsum(rng.gamma(0.25, 4.0, num - 1))])
    ratios = rng.choice([1.2, -50.0, -150.0], num, p=[0.6, 0.2, 0.2])
    lengths = rng.integers(20, 60, num)
    return [
        TraceRow(float(t), int(p), int(o), "x", float(r))
        for t, p, o, r in zip(arrival, lengths * 3, lengths, ratios)
    ]


def trace(num: int = 200, seed: int = 0):
    baseline = get_preset(PRESET).baseline_tpot_ms
    return trace_workload(adaserve_like_trace(num, seed), SLO_CONFIG, baseline)


def test_the_fleet_workload_keeps_the_traces_requests_at_the_rate_asked():
    base = trace(200)
    one_copy = fleet_workload(base, 150, 40.0, seed=1)
    assert one_copy.num_requests == 150 and one_copy.arrival_s[0] == 0.0
    assert np.all(np.diff(one_copy.arrival_s) >= 0)
    assert mean_rate_rps(one_copy) == pytest.approx(40.0, rel=0.35)  # a stretch of bursts
    # One copy: each trace row at most once, its class, SLO and lengths together.
    rows = set(zip(base.class_index, base.prompt_tokens, base.output_tokens, base.tpot_slo_ms))
    assert set(
        zip(one_copy.class_index, one_copy.prompt_tokens, one_copy.output_tokens,
            one_copy.tpot_slo_ms)
    ) <= rows  # fmt: skip
    # Five copies at independent phases: the mean rate is the one asked, closely.
    many = fleet_workload(base, 1000, 40.0, seed=1)
    assert many.num_requests == 1000
    assert mean_rate_rps(many) == pytest.approx(40.0, rel=0.1)
    assert np.bincount(many.class_index).tolist() == pytest.approx(
        (5 * np.bincount(base.class_index)).tolist(), rel=0.1
    )
    again = fleet_workload(base, 1000, 40.0, seed=1)
    assert np.array_equal(again.arrival_s, many.arrival_s)
    other = fleet_workload(base, 1000, 40.0, seed=2)
    assert not np.array_equal(other.arrival_s, many.arrival_s)
    with pytest.raises(ValueError, match="rate > 0"):
        fleet_workload(base, 10, 0.0, seed=0)


def test_the_methods_of_a_fleet():
    names = [m.name for m in fleet_methods(8, 4)]
    assert names == ["round_robin", "least_load", "slo", "round_robin+slo", "least_load+slo"]
    assert [m.name for m in fleet_methods(4, 4)] == ["round_robin", "least_load", "slo"]
    assert fleet_methods(8, 4)[2] == FleetMethod("slo", None, 8)
    with pytest.raises(ValueError, match="do not split"):
        fleet_methods(6, 4)
    with pytest.raises(ValueError, match="unknown router"):
        FleetMethod("x", "random", 1)


def no_check(instances, request, choice):
    pass


def serve(method, replicas, num, rate, check, seed=0):
    """Serve a fleet workload with `method`, calling `check(instances, request, choice)` at
    every dispatch; returns the result and the choices. Replicas run static, the cheapest
    policy whose latency grows with the batch, which is all the dispatch reads."""
    latency = get_preset(PRESET)
    budget = knee_budget(latency.verify_profile())
    workload = fleet_workload(trace(200), num, rate, seed)
    dispatcher = FleetDispatcher(method)
    choices = []

    def recording(instances, request):
        choice = dispatcher(instances, request)
        check(instances, request, choice)
        choices.append(choice)
        return choice

    policies = [make_policy("static", budget, latency.baseline_tpot_ms) for _ in range(replicas)]
    result = simulate_replicas(
        workload, latency, SYNTHETIC_DEFAULT, policies, recording, seed,
        EngineConfig(max_running_requests=16),
    )  # fmt: skip
    assert (result.finished_count == 1).all()
    return result, choices


def test_least_load_never_sends_where_more_are_in_flight_and_is_total_requests():
    total_requests = Dispatcher("total_requests")

    def check(instances, request, choice):
        in_flight = [inst.requests.size for inst in instances]
        assert in_flight[choice] == min(in_flight)
        assert choice == total_requests(instances, request)

    _, choices = serve(FleetMethod("least_load", "least_load", 1), 4, 80, 120.0, check)
    assert set(choices) == {0, 1, 2, 3}


def test_round_robin_takes_turns():
    _, choices = serve(FleetMethod("rr", "round_robin", 1), 3, 30, 60.0, no_check)
    assert choices == [0, 1, 2] * 10


def test_two_levels_the_router_picks_the_server_and_the_server_its_replica_by_slo():
    size = 2

    def check_least_load(instances, request, choice):
        servers = [instances[s : s + size] for s in range(0, len(instances), size)]
        in_flight = [sum(inst.requests.size for inst in server) for server in servers]
        server = choice // size
        assert in_flight[server] == min(in_flight)  # the least-loaded server, by its total
        assert server == in_flight.index(min(in_flight))
        loads = [replica_load(inst) for inst in servers[server]]
        slo = float(instances[0].workload.tpot_slo_ms[request])
        assert choice % size == choose_replica(loads, slo if np.isfinite(slo) else None)

    _, choices = serve(FleetMethod("ll+slo", "least_load", size), 6, 90, 150.0, check_least_load)
    assert set(choices) == set(range(6))

    _, choices = serve(FleetMethod("rr+slo", "round_robin", size), 6, 60, 150.0, no_check)
    assert [c // size for c in choices] == [0, 1, 2] * 20  # servers in turn, any replica


def test_slo_over_all_replicas_is_the_dp_dispatch_rule():
    slo_dispatch = Dispatcher("slo")

    def check(instances, request, choice):
        assert choice == slo_dispatch(instances, request)

    serve(FleetMethod("slo", None, 4), 4, 60, 120.0, check)


def test_same_seed_same_fleet_run_and_another_seed_differs():
    method = FleetMethod("ll+slo", "least_load", 2)
    first, choices = serve(method, 4, 60, 100.0, no_check, seed=3)
    again, choices_again = serve(method, 4, 60, 100.0, no_check, seed=3)
    assert choices == choices_again and np.array_equal(first.finish_s, again.finish_s)
    other, _ = serve(method, 4, 60, 100.0, no_check, seed=4)
    assert not np.array_equal(first.finish_s, other.finish_s)


def test_cli_fleet_table_json_and_last_line(tmp_path, capsys):
    entries = [
        {"emission_time_ms": 1000 * row.arrival_s, "prompt": "x", "input_length": row.input_tokens,
         "output_length": row.output_tokens, "slo_ratio": row.slo_ratio}
        for row in adaserve_like_trace(40)
    ]  # fmt: skip
    path = tmp_path / "adaserve_small.json"
    path.write_text(json.dumps(entries))
    code = sim_cli.main(
        ["--experiment", "fleet", "--trace", str(path), "--replicas", "2,4", "--server-replicas",
         "2", "--rates", "30", "--num-requests", "6", "--policies", "static", "--repeats", "1", "--preset", PRESET,
         "--acceptance", "synthetic-default", "--out", str(tmp_path)]
    )  # fmt: skip
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    name, value = lines[-1].split("=")
    assert name == GAIN_METRIC and not math.isnan(float(value))
    result = json.loads((tmp_path / "fleet_adaserve_small.json").read_text())
    rows = {(r["replicas"], r["method"]): r for r in result["rows"]}
    assert set(rows) == {
        (2, "round_robin"), (2, "least_load"), (2, "slo"), (4, "round_robin"),
        (4, "least_load"), (4, "slo"), (4, "round_robin+slo"), (4, "least_load+slo"),
    }  # fmt: skip
    assert set(rows[4, "slo"]["classes"]) == {"coding", "chat", "summarization"}
    blind = max(rows[4, m]["attainment"] for m in ("round_robin", "least_load"))
    assert float(value) == pytest.approx(100 * (rows[4, "slo"]["attainment"] - blind), abs=0.01)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--experiment", "fleet"], "--experiment fleet needs --trace PATH"),
        (["--experiment", "dp-dispatch", "--replicas", "2,4"], "takes one --replicas count"),
        (["--experiment", "fleet", "--trace", "{trace}", "--replicas", "6"], "do not split"),
        (["--replicas", "2,x"], "expected comma-separated integers"),
    ],
)
def test_bad_fleet_inputs_are_usage_errors(tmp_path, capsys, argv, message):
    path = tmp_path / "t.json"
    path.write_text(json.dumps([{"emission_time_ms": 0.0, "prompt": "x", "input_length": 5,
                                 "output_length": 5, "slo_ratio": 1.2}]))  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        sim_cli.parse_args([arg.format(trace=path) for arg in argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_replica_counts_reach_the_config():
    _, config = sim_cli.parse_args(["--experiment", "dp-dispatch", "--replicas", "4"])
    assert config.replicas == 4
