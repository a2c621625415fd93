"""The plan's track record: realized over predicted tokens per ms of planned speculation, and
the edge over a plain decode it makes a plan need."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from adaserve_inputs import drafted, slo, speculating_policy

from sgl_adaspec.speculative.adaserve.config import AdaserveConfig
from sgl_adaspec.speculative.adaserve.policy import AdaservePolicy
from sgl_adaspec.speculative.adaserve.track_record import (
    MIN_RECORD,
    PRICE_SPAN,
    PlanTrackRecord,
    PriceRecord,
)
from sgl_adaspec.speculative.policies.base import Outcome, make_outcome


def test_record_is_neutral_until_it_has_seen_enough():
    record = PlanTrackRecord()
    record.observe(10.0, 10.0, 5.0, 10.0)  # half the predicted rate, once
    assert record.ratio == 1.0
    assert record.required_edge(0.1) == pytest.approx(0.1)


def test_record_is_realized_over_predicted_rate():
    record = PlanTrackRecord(decay=1.0)
    for _ in range(int(MIN_RECORD)):
        record.observe(10.0, 10.0, 4.0, 8.0)  # predicted 1 token per ms, realized 0.5
    assert record.ratio == pytest.approx(0.5)
    # Speculation that delivered half its prediction must predict twice plain's rate (+10 %).
    assert record.required_edge(0.0) == pytest.approx(1.0)
    assert record.required_edge(0.1) == pytest.approx(1.2)


def test_record_forgets_old_iterations():
    record = PlanTrackRecord(decay=0.5)
    for _ in range(5):
        record.observe(10.0, 10.0, 5.0, 10.0)
    for _ in range(10):
        record.observe(10.0, 10.0, 10.0, 10.0)
    assert record.ratio == pytest.approx(1.0, abs=0.01)


def test_a_record_above_its_plan_lowers_no_margin():
    record = PlanTrackRecord(decay=1.0)
    for _ in range(4):
        record.observe(10.0, 10.0, 20.0, 10.0)
    assert record.ratio == pytest.approx(2.0)
    assert record.required_edge(0.1) == pytest.approx(0.1)


def test_record_refuses_nonsense():
    with pytest.raises(ValueError, match="positive times"):
        PlanTrackRecord().observe(1.0, 0.0, 1.0, 1.0)


def spec_outcome(accepted: int, iteration_ms: float, after_prefill: bool = False) -> Outcome:
    """One request's iteration of a 2-deep chain: 3 tokens verified in a flat 10 ms verify."""
    return Outcome(
        rids=("r0",), verified=torch.tensor([3]), accepted=torch.tensor([accepted]),
        verified_f=None, accepted_nodes=None, verify_ms=10.0, iteration_ms=iteration_ms,
        context_tokens=10, draft_depth=2, draft_width=1, budget=3, depth=2, width=1,
        after_prefill=after_prefill,
    )  # fmt: skip


def test_adaserve_stands_down_when_planned_speculation_falls_short_of_its_plan():
    # The plan: a 2-deep chain, 2.6 tokens in 12 ms, 2.2x a plain decode's 1 per 10 ms.
    policy = speculating_policy(AdaserveConfig(explore_interval=100))
    one = slo([math.nan])
    shapes = []
    for _ in range(6):
        shapes.append(drafted(policy, 1, 4, 2, one))
        policy.observe(spec_outcome(accepted=1, iteration_ms=12.0))  # 1 token, not 2.6
    # Three outcomes make a record of 1 / 2.6 of the plan: its 2.2x is no longer enough.
    assert shapes[:3] == [(2, 1)] * 3
    assert policy.record_at(1).ratio == pytest.approx(1 / 2.6, rel=0.01)
    assert drafted(policy, 1, 4, 2, one)[0] == 0


def test_adaserve_keeps_speculating_while_its_plans_deliver():
    policy = speculating_policy(AdaserveConfig(explore_interval=100))
    one = slo([math.nan])
    for _ in range(6):
        assert drafted(policy, 1, 4, 2, one) == (2, 1)
        policy.observe(spec_outcome(accepted=3, iteration_ms=12.0))
    # An iteration after a prefill pays SGLang's switch: no plan's price, not recorded.
    weight = policy.record_at(1).weight
    drafted(policy, 1, 4, 2, one)
    policy.observe(spec_outcome(accepted=1, iteration_ms=60.0, after_prefill=True))
    assert policy.record_at(1).weight == weight
    assert policy.record_at(1).ratio > 1.0


def test_a_short_record_at_one_load_does_not_hold_back_another():
    policy = speculating_policy(AdaserveConfig(explore_interval=100))
    policy.plain_latency.observe((2, 10), 10.0)  # a plain decode measured at two requests
    one = slo([math.nan])
    for _ in range(4):
        drafted(policy, 1, 4, 2, one)
        policy.observe(spec_outcome(accepted=1, iteration_ms=12.0))  # 1 token, not 2.6
    assert drafted(policy, 1, 4, 2, one)[0] == 0
    # At two requests the plan predicts 2.2x a plain decode's tokens per ms: short of the 2.6x
    # edge the one-request record asks, but that record was not made at this load.
    assert drafted(policy, 2, 4, 2, slo([math.nan, math.nan]))[0] > 0
    assert policy.record_at(2).ratio == 1.0 and policy.record_at(3) is policy.record_at(2)


def test_price_record_is_neutral_until_it_has_seen_enough():
    record = PriceRecord()
    for _ in range(int(MIN_RECORD) - 1):
        record.observe((4, 0), 50.0)
    assert record.factor(lambda features: 100.0) == 1.0


def test_price_record_is_measured_over_the_fit_as_it_stands():
    record = PriceRecord()
    for ms in (90.0, 110.0, 100.0, 1000.0, 95.0):  # one stalled iteration among them
        record.observe((4, 0), ms)
    assert record.factor(lambda features: 125.0) == pytest.approx(0.8)
    # A fit that has learned the same measurements is not corrected a second time.
    assert record.factor(lambda features: 100.0) == pytest.approx(1.0)
    # Each measurement against its own price: 4 requests at 0.8 of theirs, 8 at 0.8.
    mixed = PriceRecord()
    for features, ms in (((4, 0), 80.0), ((8, 0), 160.0), ((4, 0), 80.0)):
        mixed.observe(features, ms)
    assert mixed.factor(lambda features: 25.0 * features[0]) == pytest.approx(0.8)
    assert record.factor(lambda features: None) == 1.0  # no fit: nothing to correct


def test_price_record_keeps_the_last_measurements():
    record = PriceRecord()
    for _ in range(PRICE_SPAN):
        record.observe((4, 0), 200.0)
    for _ in range(PRICE_SPAN):
        record.observe((4, 0), 100.0)
    assert record.factor(lambda features: 100.0) == pytest.approx(1.0)
    assert record.count == 2 * PRICE_SPAN


def test_price_record_refuses_nonsense():
    with pytest.raises(ValueError, match="positive time"):
        PriceRecord().observe((4, 0), 0.0)


def plain_outcome(requests: int, iteration_ms: float) -> Outcome:
    """An iteration without speculation, run as a plain decode's forward (as on the CPU)."""
    return make_outcome(
        None, None, rids=tuple(f"r{i}" for i in range(requests)),
        accepted=torch.ones(requests, dtype=torch.long), verify_ms=iteration_ms,
        iteration_ms=iteration_ms, context_tokens=100 * requests, verify_as_decode=True,
    )  # fmt: skip


def observe_plain_run(policy, requests: int, times_ms) -> None:
    """Plain iterations of one batch in a row; the first, after a batch change, is no steady
    one and measures nothing."""
    for iteration_ms in (1000.0, *times_ms):
        policy.observe(plain_outcome(requests, iteration_ms))


def test_adaserve_prices_a_plain_decode_by_the_plain_decodes_measured_at_its_load():
    # Dear plain iterations at 2-3 requests (a batch filling or emptying beside the client)
    # and steady ones at 4: a price non-decreasing in the load cannot pass through both.
    policy = AdaservePolicy(AdaserveConfig())
    observe_plain_run(policy, 2, [150.0] * 3)
    observe_plain_run(policy, 3, [190.0] * 3)
    observe_plain_run(policy, 4, [118.0, 124.0, 120.0, 126.0])
    fit = policy.plain_latency.predict
    assert fit((4, 400)) > 135.0  # lifted by the dear loads
    # Measured at this very load, the price is what was measured there, whatever the fit.
    assert policy._plain_price(4, 400) == pytest.approx(122.0)
    # Within 2x of it, the fit scaled by how it held there; elsewhere the fit alone.
    assert policy._plain_price(5, 500) == pytest.approx(fit((5, 500)) * 122.0 / fit((4, 400)))
    assert policy._plain_price(8, 800) == pytest.approx(fit((8, 800)))
    # Where the plain decodes measured dearer than the fit, the price stays the fit's.
    assert policy._plain_price(3, 300) == pytest.approx(fit((3, 300)))


def test_adaserve_stands_down_where_plain_decodes_measured_cheaper_than_their_fit():
    # The plan: a 2-deep chain, 2.6 tokens in ~12 ms, against a plain decode fitted at 10 ms.
    policy = speculating_policy(AdaserveConfig(explore_interval=100))
    one = slo([math.nan])
    assert drafted(policy, 1, 4, 2, one) == (2, 1)
    policy = speculating_policy(AdaserveConfig(explore_interval=100))
    observe_plain_run(policy, 1, [4.0] * 3)  # 4 ms each; the fit, with its seed, 5.5
    assert policy.plain_latency.predict((1, 10)) == pytest.approx(5.5)
    # 2.6 tokens per 12 ms beats one per 5.5 ms, not one per 4 ms.
    assert drafted(policy, 1, 4, 2, one)[0] == 0
    assert policy._last_planned.plain_ms == pytest.approx(4.0)


def test_from_a_plain_run_the_plan_asks_the_switch_margin_of_the_batch_and_the_record_of_a_group(
    monkeypatch,
):
    """The margins the policy hands its plan: from a plain iteration, the record's edge over
    the switch margin (the batch's to clear) and the record's edge alone (each guarded
    group's); while speculating, the record's edge for both."""
    from sgl_adaspec.speculative.adaserve import pricing

    asked = []

    def planned(**kwargs):
        asked.append((kwargs["margin"], kwargs["guard_margin"]))
        return real_plan(**kwargs)

    real_plan = pricing.plan_shape
    monkeypatch.setattr(pricing, "plan_shape", planned)
    policy = speculating_policy(AdaserveConfig(explore_interval=100))
    record = policy.record_at(1)
    for _ in range(4):  # past MIN_RECORD decayed iterations
        record.observe(10.0, 10.0, 5.0, 10.0)  # delivered half the plan
    drafted(policy, 1, 4, 2, slo([math.nan]))
    policy.draft_state = dataclasses.replace(policy.draft_state, plain_run=1)  # after a plain one
    policy.plan_reuse.plans.clear()
    drafted(policy, 1, 4, 2, slo([math.nan]))
    # 1 / 0.5 - 1 = 1.0; 1.1 / 0.5 - 1 = 1.2.
    assert asked == [(1.0, 1.0), (1.2, 1.0)]
