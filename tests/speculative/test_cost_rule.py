"""adaserve's cost rule, calibrated acceptance and the one `observe` of an outcome, on
hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from sgl_adaspec.speculative.accept_calibration import AcceptanceCalibration
from sgl_adaspec.speculative.cost_rule import GainCurve, cost_budget, plan_depth
from sgl_adaspec.speculative.policies.adaserve import AdaserveConfig, AdaservePolicy
from sgl_adaspec.speculative.policies.base import make_outcome


def linear_ms(fixed: float, per_token: float):
    """verify_ms(tokens, context) = fixed + per_token * (tokens - 1)."""
    return lambda tokens, context=0: fixed + per_token * (torch.as_tensor(tokens, dtype=torch.float64) - 1)


def free_draft(steps, requests=1):
    return torch.zeros_like(torch.as_tensor(steps, dtype=torch.float64))


def curve(per_node: float, nodes: int = 64) -> GainCurve:
    gain = GainCurve(max_nodes=nodes)
    gain.curve = per_node * torch.arange(nodes + 1, dtype=torch.float64)
    return gain


def test_tokens_costing_more_than_they_return_give_no_speculation():
    # One more verified token costs as much as a whole decode (10 ms) and returns 0.9 tokens:
    # rate(k) = (1 + 0.9 k) / (10 (1 + k)) < 1 / 10 for every k >= 1.
    choice = plan_depth(
        num_requests=1, context_tokens=0, max_depth=4, width=2, gain=curve(0.9),
        verify_ms=linear_ms(10.0, 10.0), draft_ms=free_draft, plain_overhead_ms=0.0,
    )  # fmt: skip
    assert choice.depth == 0 and choice.plain_tokens_per_ms == pytest.approx(0.1)


def test_a_flat_cost_curve_gives_the_full_tree():
    choice = plan_depth(
        num_requests=4, context_tokens=0, max_depth=4, width=2, gain=curve(0.5),
        verify_ms=linear_ms(10.0, 0.0), draft_ms=free_draft, plain_overhead_ms=0.0,
    )  # fmt: skip
    assert choice.depth == 4 and choice.nodes_per_request == 8  # every node of a 4 x 2 beam
    assert choice.tokens_per_ms == pytest.approx(4 * (1 + 0.5 * 8) / 10.0)


def test_draft_cost_decides_against_a_modest_gain():
    # Verify is free past the first token, but drafting costs 6 ms per step: depth 1 gives
    # (1 + 0.5) / (10 + 6) < 1 / 10, deeper is worse still.
    choice = plan_depth(
        num_requests=1, context_tokens=0, max_depth=3, width=1, gain=curve(0.5),
        verify_ms=linear_ms(10.0, 0.0), draft_ms=lambda s, n: 6.0 * torch.as_tensor(s, dtype=torch.float64),
        plain_overhead_ms=0.0,
    )  # fmt: skip
    assert choice.depth == 0


def test_cost_budget_stops_where_the_rate_peaks():
    # f' = 0.9, 0.5, 0.1; verify 10 ms + 2 ms per extra token; draft already paid.
    # m = 0: 1/10 = .100, m = 1: 1.9/12 = .158, m = 2: 2.4/14 = .171, m = 3: 2.5/16 = .156.
    f = torch.tensor([[0.9, 0.5, 0.1]])
    budget = cost_budget(f, torch.ones_like(f, dtype=torch.bool), 0.0, 0, linear_ms(10.0, 2.0))
    assert budget == 3  # the root and two draft nodes


def test_cost_budget_with_unknown_latency_is_none():
    f = torch.tensor([[0.9]])
    assert cost_budget(f, torch.ones_like(f, dtype=torch.bool), 0.0, 0, lambda *a: None) is None


def test_gain_curve_averages_each_requests_best_nodes():
    gain = GainCurve(max_nodes=3)
    f = torch.tensor([[0.2, 0.5], [0.8, 0.3]])
    valid = torch.tensor([[True, True], [True, False]])
    gain.observe(f, valid)
    gain.refresh(lambda x: x)
    # request 0: 0.5, 0.7; request 1: 0.8, 0.8 (its second node is padding) -> mean.
    assert gain.curve.tolist() == pytest.approx([0.0, 0.65, 0.75, 0.75])
    gain.refresh(lambda x: x.sqrt())  # a new calibration re-reads the kept draft
    assert gain.curve[1].item() == pytest.approx((0.5**0.5 + 0.8**0.5) / 2)


def test_calibration_learns_an_overconfident_draft():
    calibration = AcceptanceCalibration(prior_weight=1.0)
    # Two nodes of f = 0.8 verified, one draft token accepted on average: 0.8 ** g = 0.5.
    for _ in range(200):
        calibration.observe(torch.tensor([[0.8, 0.8]]), torch.tensor([1.0]))
    assert calibration.gamma == pytest.approx(math.log(0.5) / math.log(0.8), rel=0.05)
    assert calibration.apply(torch.tensor([0.8, 0.0])).tolist() == pytest.approx([0.5, 0.0], abs=0.02)


def test_calibration_learns_an_underconfident_chain():
    """A chain always accepted whose draft gives each step 0.3: f = 0.3, 0.09, 0.027, 0.0081. No
    single factor maps all four to 1; the power does, at every depth."""
    calibration = AcceptanceCalibration()
    chain = torch.tensor([[0.3, 0.09, 0.027, 0.0081]])
    for _ in range(300):
        calibration.observe(chain, torch.tensor([4.0]))
    assert calibration.calibrated_sum(chain) == pytest.approx(4.0, rel=0.05)
    assert calibration.apply(chain).min().item() > 0.9
    # Now a draft that is right half as often as it claims at depth 1: gamma comes back.
    for _ in range(600):
        calibration.observe(torch.tensor([[0.5]]), torch.tensor([0.25]))
    assert calibration.apply(torch.tensor([0.5])).item() == pytest.approx(0.25, abs=0.03)


def test_calibration_without_observations_is_the_identity():
    calibration = AcceptanceCalibration()
    f = torch.tensor([0.9, 0.2, 0.0])
    assert calibration.apply(f).tolist() == pytest.approx(f.tolist(), abs=1e-6)


def feed(policy: AdaservePolicy, verify_ms: float, iteration_ms: float, accepted: int) -> None:
    """One plain iteration (no decision: verified 1 token) of one request."""
    outcome = make_outcome(
        None, None, rids=("r",), context_tokens=10, accepted=torch.tensor([accepted]),
        verify_ms=verify_ms, iteration_ms=iteration_ms,
    )  # fmt: skip
    policy.observe(outcome)


def test_adaserve_stands_down_then_probes():
    policy = AdaservePolicy(AdaserveConfig(probe_interval=3))
    # Measured: a 1-token verify 10 ms, 8 tokens 80 ms (every token a full decode's price).
    policy.verify_latency.seed([((1, 10), 10.0), ((8, 10), 80.0)])
    policy.gain = curve(0.5)
    assert policy.draft_shape(1, 4, 2) == (4, 2)  # no draft cost measured yet: eq. 8-9 shape
    policy.draft_latency.seed([((1, 1), 2.0), ((4, 1), 8.0)])
    shapes = [policy.draft_shape(1, 4, 2)[0] for _ in range(9)]
    # 3 plain iterations, a probe (a cold depth-1 draft, then a measured one), plain again.
    assert shapes[:3] == [0, 0, 0]
    assert shapes[3] == 1 and shapes[4] >= 1
    assert shapes[5:] == [0, 0, 0, 0]  # the next probe waits twice as long
    assert policy.stats.last_plan["speculate"] is False


def test_adaserve_plain_outcome_is_counted_apart():
    policy = AdaservePolicy(AdaserveConfig())
    feed(policy, verify_ms=10.0, iteration_ms=11.0, accepted=1)  # a plain iteration
    assert policy.plain_overhead_ms == pytest.approx(1.0)
    assert policy.stats.iterations == 0  # speculative iterations only
    assert policy.verify_latency.num_observations == 1
