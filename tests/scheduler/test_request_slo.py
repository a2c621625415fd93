"""Per-request SLO fields in custom_params: accepted forms and the errors for bad input."""

from __future__ import annotations

import pytest

from sgl_adaspec.scheduler.request_slo import (
    RequestSlo,
    parse_request_slo,
    slo_params_of_headers,
    slo_params_of_metadata,
)
from sgl_adaspec.scheduler.slo_config import BEST_EFFORT, SloClass, SloConfig

CONFIG = SloConfig(
    {"coding": SloClass("coding", baseline_multiple=1.2), "chat": SloClass("chat", tpot_ms=50)}
)


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (None, RequestSlo(BEST_EFFORT)),
        ({}, RequestSlo(BEST_EFFORT)),
        ({"other_plugin": 1}, RequestSlo(BEST_EFFORT)),
        ({"tpot_slo_ms": 20}, RequestSlo("custom", tpot_slo_ms=20.0)),
        ({"slo_class": "chat"}, RequestSlo("chat", tpot_slo_ms=50)),
        ({"slo_class": "coding"}, RequestSlo("coding", baseline_multiple=1.2)),
        ({"slo_class": "chat", "tpot_slo_ms": 50.0}, RequestSlo("chat", tpot_slo_ms=50)),
        ({"slo_class": BEST_EFFORT}, RequestSlo(BEST_EFFORT)),
    ],
)
def test_accepted_forms(params, expected):
    assert parse_request_slo(params, CONFIG) == expected


def test_default_class_applies_to_requests_without_slo():
    config = SloConfig(CONFIG.classes, default="chat")
    assert parse_request_slo({}, config) == RequestSlo("chat", tpot_slo_ms=50)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ("fast", "custom_params must be an object"),
        ({"tpot_slo_ms": "abc"}, "tpot_slo_ms must be a number"),
        ({"tpot_slo_ms": True}, "tpot_slo_ms must be a number"),
        ({"tpot_slo_ms": -5}, "tpot_slo_ms must be > 0"),
        ({"tpot_slo_ms": 0}, "tpot_slo_ms must be > 0"),
        ({"tpot_slo_ms": 1e9}, "tpot_slo_ms must be at most 60000 ms"),
        ({"slo_class": "gold"}, "slo_class 'gold' is not a known SLO class"),
        ({"slo_class": 3}, "slo_class must be a string"),
        ({"slo_class": "chat", "tpot_slo_ms": 20}, "tpot_slo_ms=20 conflicts with slo_class"),
        ({"slo_class": "coding", "tpot_slo_ms": 20}, "conflicts with slo_class 'coding'"),
    ],
)
def test_bad_input_names_the_field(params, message):
    with pytest.raises(ValueError) as err:
        parse_request_slo(params, CONFIG)
    assert message in str(err.value)


def test_ttft_slo_is_parsed_and_validated():
    slo = parse_request_slo({"slo_class": "chat", "ttft_slo_ms": 500}, CONFIG)
    assert slo.ttft_slo_ms == 500.0 and slo.tpot_slo_ms == 50
    assert parse_request_slo({"ttft_slo_ms": 80}, CONFIG).ttft_slo_ms == 80.0
    for bad, message in [(-1, "ttft_slo_ms must be > 0"), ("soon", "ttft_slo_ms must be a number")]:
        with pytest.raises(ValueError, match=message):
            parse_request_slo({"ttft_slo_ms": bad}, CONFIG)


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        (None, None),
        ("chat", None),
        ({"user_id": "7"}, None),
        ({"tpot_slo_ms": "25", "user_id": "7"}, {"tpot_slo_ms": 25.0}),
        ({"slo_class": "chat", "ttft_slo_ms": "500"}, {"slo_class": "chat", "ttft_slo_ms": 500.0}),
        ({"tpot_slo_ms": "fast"}, {"tpot_slo_ms": "fast"}),  # kept, so the check names it
    ],
)
def test_openai_metadata_carries_the_slo_fields(metadata, expected):
    assert slo_params_of_metadata(metadata) == expected


def test_slo_from_metadata_is_checked_as_custom_params():
    assert (
        parse_request_slo(slo_params_of_metadata({"tpot_slo_ms": "25"}), CONFIG).tpot_slo_ms == 25
    )
    with pytest.raises(ValueError, match="tpot_slo_ms must be a number"):
        parse_request_slo(slo_params_of_metadata({"tpot_slo_ms": "fast"}), CONFIG)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, None),
        ({"x-request-id": "abc"}, None),
        ({"x-slo-class": "chat"}, {"slo_class": "chat"}),
        ({"x-slo-tpot-ms": "45", "x-slo-ttft-ms": "900"}, {"tpot_slo_ms": 45.0, "ttft_slo_ms": 900.0}),
        # The names sglang-router forwards (it drops x-slo-*).
        ({"x-request-id-slo-class": "chat"}, {"slo_class": "chat"}),
        ({"x-request-id-slo-tpot-ms": "45"}, {"tpot_slo_ms": 45.0}),
        ({"x-request-id-slo-ttft-ms": "900"}, {"ttft_slo_ms": 900.0}),
        ({"x-slo-tpot-ms": "45", "x-request-id-slo-tpot-ms": "45.0"}, {"tpot_slo_ms": 45.0}),
    ],
)  # fmt: skip
def test_slo_headers(headers, expected):
    assert slo_params_of_headers(headers, CONFIG) == expected


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"x-request-id-slo-tpot-ms": "fast"}, "header x-request-id-slo-tpot-ms must be a number"),
        ({"x-request-id-slo-class": "platinum"}, "headers x-request-id-slo-class: slo_class"),
        ({"x-request-id-slo-ttft-ms": "-1"}, "headers x-request-id-slo-ttft-ms: ttft_slo_ms"),
        ({"x-slo-class": "chat", "x-request-id-slo-class": "coding"},
         "headers x-slo-class and x-request-id-slo-class disagree"),
    ],
)  # fmt: skip
def test_bad_slo_headers_name_the_header(headers, message):
    with pytest.raises(ValueError, match=message):
        slo_params_of_headers(headers, CONFIG)
