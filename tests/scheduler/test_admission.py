"""Admission ordering and aging on hand-built queues."""

from __future__ import annotations

import pytest

from sgl_adaspec.scheduler.admission import (
    AdmissionConfig,
    WaitingRequest,
    admission_order,
    slack_ms,
)

CONFIG = AdmissionConfig(max_wait_ms=1000.0)


def test_tight_ttft_goes_before_earlier_best_effort():
    waiting = [
        WaitingRequest(arrival_s=10.0, ttft_slo_ms=None, prompt_tokens=10),  # deadline 11.0
        WaitingRequest(arrival_s=10.2, ttft_slo_ms=200.0, prompt_tokens=10),  # deadline 10.4
    ]
    assert admission_order(waiting, now_s=10.3, config=CONFIG) == [1, 0]


def test_fcfs_among_equals():
    waiting = [WaitingRequest(10.0 + i * 0.01, None, 5) for i in range(4)]
    assert admission_order(waiting, now_s=10.1, config=CONFIG) == [0, 1, 2, 3]


def test_aged_best_effort_is_never_starved_by_urgent_arrivals():
    old = WaitingRequest(arrival_s=0.0, ttft_slo_ms=None, prompt_tokens=10)
    urgent = [WaitingRequest(1.05, 10.0, 10) for _ in range(3)]  # already late
    order = admission_order([*urgent, old], now_s=1.1, config=CONFIG)
    assert order[0] == 3  # waited 1100 ms >= max_wait: first in line


def test_aged_requests_keep_arrival_order():
    waiting = [WaitingRequest(0.5, 50.0, 1), WaitingRequest(0.1, None, 1), WaitingRequest(2.0, 10.0, 1)]
    assert admission_order(waiting, now_s=2.0, config=CONFIG) == [1, 0, 2]


def test_prefill_estimate_reduces_slack():
    config = AdmissionConfig(max_wait_ms=1000.0, prefill_ms_per_token=1.0)
    long_prompt = WaitingRequest(10.0, 500.0, 400)  # slack 500 - 400 = 100
    short_prompt = WaitingRequest(10.0, 300.0, 10)  # slack 300 - 10 = 290
    assert slack_ms(long_prompt, 10.0, config) == pytest.approx(100.0)
    assert admission_order([short_prompt, long_prompt], 10.0, config) == [1, 0]


def test_bad_config_is_rejected():
    with pytest.raises(ValueError):
        AdmissionConfig(max_wait_ms=0)
    with pytest.raises(ValueError):
        AdmissionConfig(prefill_ms_per_token=-1)
