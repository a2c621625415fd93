"""The scheduler's loop clock: what a decode iteration's requests waited on prefills."""

from __future__ import annotations

import pytest
import torch

from sgl_adaspec.adapters.speculative.runtime import LoopClock


def test_requests_running_across_a_prefill_waited_for_it():
    clock = LoopClock()
    assert clock.stall_ms(frozenset({"a", "b"}), 1.0) == 0.0  # the first decode iteration
    clock.last_decode_end_s = 1.010
    assert clock.stall_ms(frozenset({"a", "b"}), 1.011) == 0.0  # no prefill between
    clock.last_decode_end_s = 1.020
    clock.interrupt()  # two prefills, then a decode iteration with a new request
    clock.interrupt()
    assert clock.last_decode_end_s is None
    assert clock.stall_ms(frozenset({"a", "b", "c"}), 1.050) == pytest.approx(30.0)
    clock.last_decode_end_s = 1.060
    assert clock.stall_ms(frozenset({"a", "b", "c"}), 1.061) == 0.0  # counted once


def test_requests_that_did_not_run_before_a_prefill_did_not_wait_for_it():
    clock = LoopClock()
    clock.stall_ms(frozenset({"a"}), 1.0)
    clock.last_decode_end_s = 1.010
    clock.interrupt()  # "a" finished; the prefill brings "b"
    assert clock.stall_ms(frozenset({"b"}), 1.050) == 0.0


def test_a_request_s_slo_clock_starts_at_the_first_token_sglang_stamped():
    """`first_token_s`: the end of the request's prefill as SGLang stamps it, where it did and
    not in the future; else the first decode iteration's time (`now`)."""
    from types import SimpleNamespace

    from sgl_adaspec.adapters.speculative.request_state import first_token_s

    def req(stamp):
        return SimpleNamespace(time_stats=SimpleNamespace(prefill_finished_time=stamp))

    assert first_token_s(req(100.25), now=100.5) == 100.25  # waited 250 ms for its first decode
    assert first_token_s(req(0.0), now=100.5) == 100.5  # no stamp (prefilled on another node)
    assert first_token_s(req(101.0), now=100.5) == 100.5  # never later than now
    assert first_token_s(SimpleNamespace(), now=100.5) == 100.5


def test_on_the_overlap_schedule_a_request_s_tokens_are_those_its_iterations_committed():
    """On SGLang's overlap schedule an iteration runs before the previous one's tokens reach
    `req.output_ids`: the SLO state counts what the request's iterations committed, so a
    request is not read one iteration behind (and its prefill's token, not yet in its output
    at its first decode iteration, is not counted as decoded)."""
    from types import SimpleNamespace

    from sgl_adaspec.adapters.speculative.request_state import RequestState, record_committed
    from sgl_adaspec.scheduler.request_slo import RequestSlo

    state = RequestState(
        RequestSlo("custom", tpot_slo_ms=50.0), first_token_s=0.0, tokens_at_start=1,
        policy=SimpleNamespace(),
    )  # fmt: skip
    req = SimpleNamespace(_adaspec_state=state, output_ids=[])
    assert state.tokens_decoded(len(req.output_ids)) == 0  # the first decode iteration
    record_committed([req], torch.tensor([4]))  # it commits 4; its output still lags
    req.output_ids = [7]  # the prefill's token arrives
    assert state.tokens_decoded(len(req.output_ids)) == 4
    record_committed([req], 1)  # a plain iteration
    req.output_ids = [7] * 5  # the first iteration's 4 arrive
    assert state.tokens_decoded(len(req.output_ids)) == 5
    # Synchronously (no lag) the output and the count agree.
    req.output_ids = [7] * 6
    assert state.tokens_decoded(len(req.output_ids)) == 5
