"""The fleet view of one scheduler (`scheduler/slo_load.py`) on hand-computed cases, as a
gateway reads it back (`replica_load`), and its Prometheus gauges."""

from __future__ import annotations

import math

from sgl_adaspec.scheduler.dp_dispatch import ReplicaLoad
from sgl_adaspec.scheduler.slo_load import OpenRequest, replica_load, slo_load

CURVE = [10.0, 12.0, 15.0, 20.0]


def test_classes_their_tpot_now_and_the_tpot_with_more_requests():
    requests = [
        OpenRequest("chat", 50.0, decode_elapsed_ms=400.0, tokens_out=10),  # 40 ms/token
        OpenRequest("chat", 30.0, decode_elapsed_ms=700.0, tokens_out=10),  # 70: behind
        OpenRequest("best_effort", None, decode_elapsed_ms=100.0, tokens_out=0),  # no token yet
    ]
    view = slo_load(
        requests, CURVE, waiting=1, baseline_tpot_ms=9.5, slo_classes_ms={"chat": 50.0}, added=3
    )
    assert view["running"] == 3 and view["waiting"] == 1
    assert view["classes"] == {
        "best_effort": {
            "requests": 1, "tpot_slo_ms": None, "tpot_now_ms": None, "tpot_now_max_ms": None,
            "behind": 0,
        },
        "chat": {
            "requests": 2, "tpot_slo_ms": 30.0, "tpot_now_ms": 55.0, "tpot_now_max_ms": 70.0,
            "behind": 1,
        },
    }  # fmt: skip
    # Four requests in the load (three running, one waiting): 5, 6, 7 with 1, 2, 3 more; the
    # curve's last point past its end.
    assert view["tpot_ms_added"] == [20.0, 20.0, 20.0]
    assert view["tightest_slo_ms"] == 30.0
    assert view["margin_ms"] == 30.0 - 20.0
    assert view["tpot_ms_by_requests"] == CURVE
    assert view["baseline_tpot_ms"] == 9.5 and view["slo_classes_ms"] == {"chat": 50.0}


def test_an_idle_server_and_one_without_a_latency_fit():
    idle = slo_load([], CURVE)
    assert idle["running"] == 0 and idle["classes"] == {}
    assert idle["tpot_ms_added"][:3] == [10.0, 12.0, 15.0]
    assert idle["margin_ms"] is None and idle["tightest_slo_ms"] is None  # no SLO in force
    unfitted = slo_load([OpenRequest("chat", 50.0, 10.0, 1)], (), running=5)
    assert unfitted["running"] == 5  # SGLang's count where given
    assert unfitted["tpot_ms_added"] == [] and unfitted["margin_ms"] is None


def test_a_gateway_reads_a_view_as_the_dp_dispatch_reads_a_replica():
    view = slo_load(
        [OpenRequest("chat", 50.0, 40.0, 1), OpenRequest("coding", 25.0, 40.0, 1)], CURVE,
        waiting=2,
    )  # fmt: skip
    assert replica_load(view) == ReplicaLoad(4, (50.0, 25.0), tuple(CURVE))
    assert replica_load({}) == ReplicaLoad(0, (), ())


def test_the_view_as_prometheus_gauges(prometheus_sink):
    from prometheus_client import REGISTRY

    def sample(name: str, **labels) -> float | None:
        return REGISTRY.get_sample_value(f"sglang_adaspec:{name}", labels)

    assert sample("slo_running_requests", slo_class="chat") == 0  # from the start
    view = slo_load(
        [OpenRequest("chat", 50.0, 400.0, 10), OpenRequest("custom_le_20ms", 20.0, 300.0, 10)],
        CURVE, added=2,
    )  # fmt: skip
    prometheus_sink.observe_slo_load(view)
    assert sample("slo_running_requests", slo_class="chat") == 1
    assert sample("slo_running_tpot_seconds", slo_class="chat") == 0.04
    assert sample("slo_running_tpot_slo_seconds", slo_class="chat") == 0.05
    assert sample("slo_running_behind", slo_class="custom_le_20ms") == 1
    assert sample("predicted_tpot_seconds", added="1") == 0.015
    assert sample("predicted_tpot_seconds", added="2") == 0.02
    assert math.isclose(sample("slo_margin_seconds"), 0.005)
    # The requests left: the classes read 0 and NaN, not their last load.
    prometheus_sink.observe_slo_load(slo_load([], CURVE, added=2))
    assert sample("slo_running_requests", slo_class="custom_le_20ms") == 0
    assert math.isnan(sample("slo_running_tpot_seconds", slo_class="chat"))
    assert math.isnan(sample("slo_margin_seconds"))
