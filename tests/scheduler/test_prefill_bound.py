"""Prefill budget from the running requests' TPOT allowances."""

from __future__ import annotations

from sgl_adaspec.scheduler.prefill_bound import RunningSlo, allowance_ms, prefill_token_budget


def test_allowance_is_time_left_before_the_next_token_is_late():
    assert allowance_ms(RunningSlo(50.0, 480.0, 10)) == 50.0 * 11 - 480.0  # 70 ms
    assert allowance_ms(RunningSlo(None, 480.0, 10)) == float("inf")


def test_tightest_running_request_bounds_the_prefill():
    running = [RunningSlo(50.0, 480.0, 10), RunningSlo(150.0, 100.0, 1), RunningSlo(None, 0, 0)]
    # 70 ms allowance at 0.5 ms per prompt token -> 140 tokens.
    assert prefill_token_budget(running, 0.5, chunk_limit=4096, min_tokens=16) == 140


def test_prefill_always_progresses_and_never_exceeds_the_chunk_limit():
    late = [RunningSlo(10.0, 500.0, 10)]  # already 390 ms behind
    assert prefill_token_budget(late, 0.5, chunk_limit=4096, min_tokens=64) == 64
    relaxed = [RunningSlo(1000.0, 0.0, 0)]
    assert prefill_token_budget(relaxed, 0.01, chunk_limit=512) == 512
    assert prefill_token_budget([], 0.5, chunk_limit=512) == 512
    assert prefill_token_budget(relaxed, 0.0, chunk_limit=512) == 512  # no cost model yet
