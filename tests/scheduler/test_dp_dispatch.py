"""SLO-aware dispatch across DP replicas: the rule (`dp_dispatch.py`) on hand-computed cases,
the replica's report and the controller's dispatcher (`dp_adapter.py`) on fakes of SGLang's
controller (only the attributes the dispatcher reads)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from sgl_adaspec.adapters import dp as dp_adapter
from sgl_adaspec.adapters.dp import (
    READ_INTERVAL_S,
    REPORT_INTERVAL_S,
    STATE_DIR_ENV,
    ReplicaReporter,
    SloDispatcher,
)
from sgl_adaspec.config import AdaspecConfig
from sgl_adaspec.scheduler.dp_dispatch import ReplicaLoad, choose_replica, margin_ms
from sgl_adaspec.speculative.policies.base import PolicyBase

# Per-token time with 1, 2, 3, 4 requests.
CURVE = (10.0, 20.0, 30.0, 40.0)


def test_margin_is_the_tightest_slo_in_force_less_the_time_with_one_more_request():
    replica = ReplicaLoad(requests=1, slos_ms=(50.0,), tpot_ms_by_requests=CURVE)
    assert margin_ms(replica, 100.0) == 50.0 - 20.0  # the running request's 50 ms binds
    assert margin_ms(replica, 25.0) == 25.0 - 20.0  # the new request's own binds
    assert margin_ms(ReplicaLoad(0, (), CURVE), None) == math.inf
    # Past the curve's end: its last point.
    assert margin_ms(ReplicaLoad(9, (100.0,), CURVE), None) == 100.0 - 40.0
    assert margin_ms(ReplicaLoad(1, (50.0,)), 100.0) is None


def test_a_request_goes_to_the_fastest_replica_where_every_slo_holds():
    # Replica 0 is faster with one more (20 ms/token) but holds a 15 ms request that would
    # miss; replica 1 (30 ms/token with a third) has room for a 40 ms request.
    replicas = [ReplicaLoad(1, (15.0,), CURVE), ReplicaLoad(2, (), CURVE)]
    assert choose_replica(replicas, 40.0) == 1
    # A 25 ms request fits nowhere (-5 and -5 ms): the least harm, then the faster.
    assert choose_replica(replicas, 25.0) == 0


def test_loose_requests_spread_by_speed_not_by_the_tightest_slo_in_force():
    # Both replicas keep every SLO with a 500 ms request; the faster one takes it, though
    # the other holds no tight request (margins 30-20=10 vs 500-40=460 ms). Sending it to the
    # largest margin piled the loose classes onto such replicas in the simulator.
    replicas = [ReplicaLoad(1, (30.0,), CURVE), ReplicaLoad(3, (500.0,), CURVE)]
    assert choose_replica(replicas, 500.0) == 0
    assert choose_replica(replicas, None) == 0


def test_best_effort_keeps_off_replicas_whose_slos_it_would_break():
    # Replica 0 is faster with one more (20 ms) but holds a 15 ms request it would push past
    # its SLO; replica 1 is slower (30 ms) but has no SLO in force.
    replicas = [ReplicaLoad(1, (15.0,), CURVE), ReplicaLoad(2, (), CURVE)]
    assert choose_replica(replicas, None) == 1
    # Where it harms none, the fastest: replica 0's 50 ms request holds at 20 ms.
    replicas = [ReplicaLoad(1, (50.0,), CURVE), ReplicaLoad(2, (), CURVE)]
    assert choose_replica(replicas, None) == 0
    # Harm everywhere: the least (largest margin).
    replicas = [ReplicaLoad(1, (15.0,), CURVE), ReplicaLoad(1, (12.0,), CURVE)]
    assert choose_replica(replicas, None) == 0


def test_ties_go_to_the_faster_then_the_emptier_replica_and_unknown_times_to_the_count():
    assert choose_replica([ReplicaLoad(2, (), CURVE), ReplicaLoad(1, (), CURVE)], 1000.0) == 1
    # No per-token time for replica 1 yet: fewest requests in flight.
    assert choose_replica([ReplicaLoad(2, (), CURVE), ReplicaLoad(1)], 20.0) == 1
    with pytest.raises(ValueError, match="no replica"):
        choose_replica([], None)


def fitted_policy() -> PolicyBase:
    policy = PolicyBase()
    for n, ms in ((1, 10.0), (2, 14.0), (4, 22.0), (8, 38.0)):
        policy.plain_latency.observe((n, 0), ms)
    policy.verify_ms = 12.0
    return policy


def test_the_report_is_written_whole_throttled_and_at_once_when_no_slo_is_left(tmp_path):
    reporter = ReplicaReporter(tmp_path / "dp0.json", max_requests=4)
    policy = fitted_policy()
    reporter.track("a", 50.0)
    reporter.track("b", None)  # best effort: not listed
    assert reporter.maybe_write(policy, now_s=100.0)
    report = json.loads((tmp_path / "dp0.json").read_text())
    assert report["slos_ms"] == {"a": 50.0}
    curve = report["tpot_ms_by_requests"]
    assert len(curve) == 4 and curve[0] < curve[1] < curve[3]
    assert curve[0] == pytest.approx(10.0, abs=1.0) and curve[3] == pytest.approx(22.0, abs=1.0)
    assert report["baseline_tpot_ms"] == 12.0
    reporter.track("c", 80.0)
    assert not reporter.maybe_write(policy, now_s=100.0 + REPORT_INTERVAL_S / 2)
    assert reporter.maybe_write(policy, now_s=100.0 + 2 * REPORT_INTERVAL_S)
    reporter.finish("a")
    reporter.finish("c")
    assert reporter.maybe_write(policy, now_s=100.0 + 2 * REPORT_INTERVAL_S)  # empty: at once
    assert json.loads((tmp_path / "dp0.json").read_text())["slos_ms"] == {}
    assert not reporter.maybe_write(policy, now_s=200.0)  # nothing changed


class FakeController:
    """Two replicas; what SGLang's controller gives the dispatcher."""

    def __init__(self, requests):
        self.workers = ["w0", "w1"]
        self._active_workers = [0, 1]
        self.dp_budget = SimpleNamespace(total_requests=list(requests))
        self.refreshes = 0

    def refresh_load_budget(self):
        self.refreshes += 1

    def maybe_external_dp_rank_routing(self, req):
        return False


def request(rid, tpot_slo_ms=None):
    params = None if tpot_slo_ms is None else {"tpot_slo_ms": tpot_slo_ms}
    return SimpleNamespace(rid=rid, sampling_params=SimpleNamespace(custom_params=params))


@pytest.fixture
def dispatcher(tmp_path, monkeypatch):
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("ADASPEC_CONFIG", AdaspecConfig(spec_policy="adaserve").to_json())
    sent = []
    monkeypatch.setattr(dp_adapter, "send", lambda worker, req: sent.append((worker, req.rid)))
    controller = FakeController([1, 1])
    dispatcher = SloDispatcher(controller)
    dispatcher.sent = sent
    return dispatcher


def write_report(folder, rank, slos, curve=CURVE):
    report = {"slos_ms": slos, "tpot_ms_by_requests": list(curve), "baseline_tpot_ms": 10.0}
    (folder / f"dp{rank}.json").write_text(json.dumps(report))


def test_the_dispatcher_reads_reports_and_counts_what_it_sent_until_they_list_it(
    dispatcher, tmp_path
):
    write_report(tmp_path, 0, {"x": 25.0})
    write_report(tmp_path, 1, {"y": 500.0})
    dispatcher(request("tight", 24.0))  # margins 24-20=4 vs 24-20=4: tie, both one request
    dispatcher(request("tight2", 21.0))
    first, second = dispatcher.sent
    # The first tight request is counted on its replica, so the second goes to the other.
    assert {first[0], second[0]} == {"w0", "w1"}
    assert dispatcher.controller.dp_budget.total_requests == [2, 2]
    rank = 0 if first[0] == "w0" else 1
    assert dispatcher.replica_load(rank).slos_ms[-1] == 24.0
    # Once the replica's report lists it, it is counted from the report alone.
    slos = {"x": 25.0} if rank == 0 else {"y": 500.0}
    write_report(tmp_path, rank, {**slos, "tight": 24.0})
    dispatcher.refresh(now=dispatcher.last_read_s + READ_INTERVAL_S)
    assert sorted(dispatcher.replica_load(rank).slos_ms) == sorted([*slos.values(), 24.0])


def test_without_reports_the_dispatcher_sends_to_the_fewest_requests(dispatcher):
    dispatcher.controller.dp_budget.total_requests = [3, 1]
    dispatcher(request("a", 30.0))
    dispatcher(request("b"))
    assert [worker for worker, _ in dispatcher.sent] == ["w1", "w1"]
    dispatcher(request("c"))  # 3 vs 3: the first
    assert dispatcher.sent[-1][0] == "w0"
