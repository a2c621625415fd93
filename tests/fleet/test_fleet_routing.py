"""The gateway's routing rule (`fleet/routing.py`): where a request's SLO is read, the headers
that carry it across sglang-router, the routing keys learned per server, the server chosen."""

from __future__ import annotations

import pytest

from sgl_adaspec.fleet.routing import (
    CHAT,
    COMPLETIONS,
    GENERATE,
    Fleet,
    KeyBook,
    request_slo,
    request_slo_ms,
)

CLASSES = {"chat": 50.0, "coding": None}


@pytest.mark.parametrize(
    ("path", "body", "headers", "params", "extra"),
    [
        # /generate's custom_params: dropped by the router, so carried in headers.
        (GENERATE, {"sampling_params": {"custom_params": {"slo_class": "chat", "x": 1}}}, {},
         {"slo_class": "chat"}, {"x-request-id-slo-class": "chat"}),
        (GENERATE, {"sampling_params": [{"custom_params": {"tpot_slo_ms": 40.0}}]}, {},
         {"tpot_slo_ms": 40.0}, {"x-request-id-slo-tpot-ms": "40"}),
        # Chat: custom_params dropped, metadata kept.
        (CHAT, {"custom_params": {"tpot_slo_ms": 40, "ttft_slo_ms": 900}}, {},
         {"tpot_slo_ms": 40, "ttft_slo_ms": 900},
         {"x-request-id-slo-tpot-ms": "40", "x-request-id-slo-ttft-ms": "900"}),
        (CHAT, {"metadata": {"slo_class": "chat"}}, {}, {"slo_class": "chat"}, {}),
        # Completions: custom_params kept.
        (COMPLETIONS, {"custom_params": {"slo_class": "chat"}}, {}, {"slo_class": "chat"}, {}),
        # Headers: x-slo-* dropped, so renamed; the body wins over them, as on a server.
        (COMPLETIONS, {}, {"x-slo-tpot-ms": "45"}, {"tpot_slo_ms": "45"},
         {"x-request-id-slo-tpot-ms": "45"}),
        (GENERATE, None, {"x-request-id-slo-class": "chat"}, {"slo_class": "chat"},
         {"x-request-id-slo-class": "chat"}),
        (COMPLETIONS, {"custom_params": {"slo_class": "chat"}}, {"x-slo-class": "coding"},
         {"slo_class": "chat"}, {}),
        (GENERATE, {"text": "hi"}, {}, None, {}),
    ],
)  # fmt: skip
def test_the_requests_slo_and_the_headers_that_carry_it(path, body, headers, params, extra):
    assert request_slo(path, body, headers) == (params, extra)


@pytest.mark.parametrize(
    ("params", "ms"),
    [
        (None, None), ({"tpot_slo_ms": "45"}, 45.0), ({"tpot_slo_ms": "fast"}, None),
        ({"tpot_slo_ms": -1}, None), ({"slo_class": "chat"}, 50.0),
        ({"slo_class": "coding"}, None),  # relative, the baseline not known yet
        ({"slo_class": "platinum"}, None), ({"ttft_slo_ms": 900}, None),
    ],
)  # fmt: skip
def test_the_tpot_slo_in_ms(params, ms):
    assert request_slo_ms(params, CLASSES) == ms


def test_keys_are_learned_per_server_and_follow_a_move():
    book = KeyBook(prefix="gw")
    first, second = book.key_for(0), book.key_for(None)
    assert first != second and first.startswith("gw-")
    book.learn({0: {first: 3.0, "someone-else": 0.1}, 1: {}})
    assert book.keys == {0: first}
    assert book.key_for(0) == first and book.key_for(1) not in (first, second)
    # The router moved `first` to server 1 (its worker was unhealthy): seen there last.
    book.learn({0: {first: 9.0, second: 1.0}, 1: {first: 0.5}})
    assert book.keys == {0: second, 1: first}


def view(running: int, slos: dict[str, float], curve: list[float]) -> dict:
    return {
        "running": running, "waiting": 0, "tpot_ms_by_requests": curve,
        "classes": {name: {"requests": 1, "tpot_slo_ms": ms} for name, ms in slos.items()},
        "slo_classes_ms": CLASSES,
    }  # fmt: skip


def test_the_server_is_chosen_by_the_dp_dispatch_rule_over_every_replica():
    fleet = Fleet([None, None])
    assert fleet.choose(50.0) is None  # no view yet: the router places it
    tight = view(4, {"chat": 20.0}, [10.0, 12.0, 15.0, 18.0, 21.0, 25.0])
    loose = view(4, {"summarization": 150.0}, [10.0, 12.0, 15.0, 18.0, 21.0, 25.0])
    fleet.update([[tight], [loose]])
    assert fleet.classes_ms() == CLASSES
    # A fifth request on server 0 takes it to 21 ms over its 20 ms SLO: server 1 is harmless.
    assert fleet.choose(50.0) == 1
    # The gateway counts what it sent until the next views: server 1 then holds 6 (25 ms),
    # over the new request's own 22 ms SLO, and server 0 stays at 21 ms: the larger margin.
    fleet.choose(None)
    assert fleet.choose(22.0) == 0
    # A server of two replicas: its idle second replica wins.
    fleet.update([[tight], [loose, view(0, {}, [10.0, 12.0])]])
    assert fleet.choose(20.0) == 1
    # A server that did not answer is left out.
    fleet.update([None, [loose]])
    assert fleet.choose(20.0) == 1
