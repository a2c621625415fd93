"""SLO-aware dispatch across DP replicas: the rule (`dp_dispatch.py`) on hand-computed cases,
and the replica's report and the dispatcher's book of reports (`replica_report.py`). The
adapter on SGLang's load snapshots: `test_dp_transport.py`."""

from __future__ import annotations

import math

import pytest

from sgl_adaspec.scheduler.dp_dispatch import ReplicaLoad, choose_replica, margin_ms, targets_ms
from sgl_adaspec.scheduler.replica_report import (
    MAX_LISTED,
    PENDING_S,
    REPORT_INTERVAL_S,
    ReplicaReporter,
    ReportBook,
    rid_key,
)
from sgl_adaspec.scheduler.request_slo import RequestSlo

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


def test_a_replica_that_cannot_meet_the_slo_alone_is_not_offered_it_while_another_can():
    # Replica 0 is fast but loaded (margin min(12, 25) - 40 = -28); replica 1 is idle but
    # takes 30 ms per token even alone, over the request's 25 ms (margin -5). The least harm
    # would be replica 1, which can never meet it; replica 0 can once its load drains.
    replicas = [ReplicaLoad(3, (12.0,), CURVE), ReplicaLoad(0, (), (30.0, 35.0))]
    assert choose_replica(replicas, 25.0) == 0
    # Where no replica can meet it alone, the least harm as before.
    replicas = [ReplicaLoad(3, (12.0,), (26.0, 40.0)), ReplicaLoad(0, (), (30.0, 35.0))]
    assert choose_replica(replicas, 25.0) == 1
    # Best effort: no replica is ruled out.
    assert choose_replica([ReplicaLoad(3, (), CURVE), ReplicaLoad(0, (), (30.0,))], None) == 1


def test_relative_classes_resolve_against_each_replicas_own_baseline():
    coding = RequestSlo("coding", baseline_multiple=1.2)
    assert targets_ms(coding, [10.0, 30.0]) == [pytest.approx(12.0), pytest.approx(36.0)]
    assert targets_ms(coding, [10.0, None]) == [pytest.approx(12.0), None]
    assert targets_ms(RequestSlo("chat", tpot_slo_ms=50.0), [10.0, 30.0]) == [50.0, 50.0]
    assert targets_ms(RequestSlo("best_effort"), [10.0, 30.0]) == [None, None]
    assert targets_ms(None, [10.0]) == [None]
    # Replica 1 runs at three times replica 0's baseline (other hardware). Against its own
    # baseline the class holds there (36 ms target, 33 ms alone); against replica 0's, replica
    # 1 could never meet it, and the request would join replica 0's queue past its SLO.
    replicas = [ReplicaLoad(2, (), (11.0, 13.0, 15.0)), ReplicaLoad(0, (), (33.0, 40.0))]
    assert choose_replica(replicas, targets_ms(coding, [10.0, 30.0])) == 1
    assert choose_replica(replicas, 12.0) == 0


def reporter(curve=(10.0, 14.0), baseline=12.0) -> ReplicaReporter:
    return ReplicaReporter(lambda: curve, lambda: baseline)


def test_the_report_is_rebuilt_when_changed_throttled_and_at_once_when_no_slo_is_left():
    replica = reporter()
    replica.track("a", 50.0)
    replica.track("b", None)  # best effort: not listed
    assert replica.due(100.0)
    report = replica.current(100.0)
    assert report.slos_ms == {rid_key("a"): 50.0}
    assert report.tpot_ms_by_requests == (10.0, 14.0) and report.baseline_tpot_ms == 12.0
    replica.track("c", 80.0)
    assert not replica.due(100.0 + REPORT_INTERVAL_S / 2)
    assert replica.current(100.0 + REPORT_INTERVAL_S / 2) is report  # the last one stands
    assert rid_key("c") in replica.current(100.0 + 2 * REPORT_INTERVAL_S).slos_ms
    replica.finish("a")
    replica.finish("c")
    assert replica.due(100.0 + 2 * REPORT_INTERVAL_S)  # empty: at once
    assert replica.current(100.0 + 2 * REPORT_INTERVAL_S).slos_ms == {}
    assert not replica.due(200.0)  # nothing changed


def test_a_report_lists_the_tightest_slos_within_its_bound():
    replica = reporter()
    for i in range(MAX_LISTED + 10):
        replica.track(f"r{i}", 1000.0 - i)
    listed = replica.current(0.0).slos_ms
    assert len(listed) == MAX_LISTED and min(listed.values()) == 1000.0 - (MAX_LISTED + 9)
    assert rid_key("r0") not in listed  # the loosest left off


def test_the_book_counts_what_was_sent_until_a_report_lists_it_or_it_expires():
    book = ReportBook()
    book.receive(0, reporter().current(0.0))
    book.sent(0, "tight", 24.0, now_s=10.0)
    book.sent(0, "loose", None, now_s=10.0)  # best effort: nothing to count
    assert book.load(0, requests=1) == ReplicaLoad(1, (24.0,), (10.0, 14.0))
    assert book.baseline_ms(0) == 12.0 and book.baseline_ms(1) is None
    listed = reporter()
    listed.track("tight", 24.0)
    book.receive(0, listed.current(0.0))
    assert book.load(0, requests=1).slos_ms == (24.0,)  # from the report alone
    # SGLang counts no request there: the report is older than its count.
    assert book.load(0, requests=0).slos_ms == ()
    book.sent(1, "other", 30.0, now_s=10.0)
    book.expire(10.0 + PENDING_S / 2)
    assert book.load(1, requests=1).slos_ms == (30.0,)
    book.expire(10.0 + 2 * PENDING_S)
    assert book.load(1, requests=1) == ReplicaLoad(1)
