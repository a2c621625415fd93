"""The fleet view's SGLang adapter on stand-ins for SGLang's requests: the view of the
requests decoding in a scheduler, its gauges when the last one leaves, and the routing keys
the HTTP process lists."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sgl_adaspec.adapters import fleet_view
from sgl_adaspec.adapters.speculative import request_state
from sgl_adaspec.adapters.speculative.runtime import now_s
from sgl_adaspec.speculative.policies.base import PolicyBase


def fitted_policy() -> PolicyBase:
    policy = PolicyBase()
    for n, ms in ((1, 10.0), (2, 14.0), (4, 22.0), (8, 38.0)):
        policy.plain_latency.observe((n, 0), ms)
    policy.verify_ms = 12.0
    return policy


def fake_request(rid: str, custom_params) -> SimpleNamespace:
    return SimpleNamespace(
        rid=rid, sampling_params=SimpleNamespace(custom_params=custom_params), output_ids=[7],
        time_stats=SimpleNamespace(prefill_finished_time=0.0), finished=lambda: True,
    )  # fmt: skip


def test_the_view_of_the_requests_decoding_and_its_gauges_when_the_last_leaves(
    prometheus_sink, monkeypatch
):
    from prometheus_client import REGISTRY

    monkeypatch.setattr(fleet_view, "_last_publish_s", float("-inf"))
    policy = fitted_policy()
    policy.stats.sinks.append(prometheus_sink)
    reqs = [
        fake_request("a", {"slo_class": "summarization"}),
        fake_request("b", {"tpot_slo_ms": 15}),
        fake_request("c", None),
    ]
    request_state.track_requests(reqs, policy)
    request_state.record_committed(reqs, 2)
    assert len(request_state.open_states()) == 3
    view = fleet_view.scheduler_view(policy, running=3, waiting=1)
    assert set(view["classes"]) == {"summarization", "custom_le_20ms", "best_effort"}
    assert view["classes"]["summarization"]["tpot_slo_ms"] == 150.0
    assert view["classes"]["custom_le_20ms"]["requests"] == 1
    assert view["tightest_slo_ms"] == 15.0 and view["running"] == 3 and view["waiting"] == 1
    # The policy's plain fit, as the DP reports: about 26 ms with a fifth request.
    assert view["tpot_ms_added"][0] == pytest.approx(26.0, abs=1.5)
    assert view["margin_ms"] == pytest.approx(15.0 - view["tpot_ms_added"][0], abs=1e-3)
    assert view["slo_classes_ms"]["chat"] == 50.0
    assert view["slo_classes_ms"]["coding"] == pytest.approx(1.2 * policy.baseline_tpot_ms())

    fleet_view.publish(policy, now_s())
    gauge = "sglang_adaspec:slo_running_requests"
    assert REGISTRY.get_sample_value(gauge, {"slo_class": "summarization"}) == 1
    request_state.request_finished(None, reqs[0])
    # Within the throttle's second: not published yet.
    assert REGISTRY.get_sample_value(gauge, {"slo_class": "summarization"}) == 1
    for req in reqs[1:]:
        request_state.request_finished(None, req)
    assert request_state.open_states() == []
    # At once when the last request left.
    assert REGISTRY.get_sample_value(gauge, {"slo_class": "summarization"}) == 0


def test_the_http_process_lists_the_routing_keys_it_was_sent_lately(monkeypatch):
    monkeypatch.setattr(fleet_view, "_routing_keys", type(fleet_view._routing_keys)())
    monkeypatch.setattr(fleet_view, "ROUTING_KEYS_KEPT", 2)
    fleet_view.note_routing_key({})
    for key in ("a", "b", "a", "c"):
        fleet_view.note_routing_key({"x-smg-routing-key": key})
    assert list(fleet_view.recent_routing_keys()) == ["a", "c"]  # the 2 most recent
    later = fleet_view._routing_keys["c"] + fleet_view.ROUTING_KEY_TTL_S + 1
    assert fleet_view.recent_routing_keys(now=later) == {}


def test_the_route_on_sglangs_app_answers_with_the_schedulers_views(monkeypatch):
    import asyncio

    from sglang.srt.entrypoints import http_server

    class Manager:
        async def get_internal_state(self):
            return [{"adaspec": {"slo_load": {"running": 2}}}, {"adaspec": None}]

    global_state = SimpleNamespace(tokenizer_manager=Manager())
    monkeypatch.setattr(http_server, "get_global_state", lambda: global_state)
    monkeypatch.setattr(fleet_view, "_routing_keys", type(fleet_view._routing_keys)())
    fleet_view.note_routing_key({"x-smg-routing-key": "k"})
    fleet_view.add_routes("server_args", "tokenizer_manager")
    fleet_view.add_routes()  # once only
    (route,) = [r for r in http_server.app.routes if getattr(r, "path", None) == fleet_view.ROUTE]
    assert route.methods == {"GET"}
    body = asyncio.run(route.endpoint())
    assert body["replicas"] == [{"running": 2}, None] and list(body["routing_keys"]) == ["k"]
