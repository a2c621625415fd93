"""The adaserve policy object: plan (shape, budget), shape restriction, latency estimates."""

from __future__ import annotations

import math

import pytest
import torch

from sgl_adaspec.scheduler.request_slo import RequestSlo
from sgl_adaspec.scheduler.slo import SloBatch
from sgl_adaspec.speculative.adaserve.config import AdaserveConfig
from sgl_adaspec.speculative.adaserve.knee_shape import AdaptiveTreeConfig
from sgl_adaspec.speculative.adaserve.policy import AdaservePolicy
from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.policies.base import make_outcome
from sgl_adaspec.speculative.shapes import restrict_to_shape
from sgl_adaspec.speculative.stats import SpecStats


def chain_and_fan() -> Candidates:
    """One request: root -> 0 (f .9) -> 2 (.6) -> 4 (.3); root -> 1 (.5) -> 3 (.4);
    root -> 5 (.2)."""
    parents = torch.tensor([[-1, -1, 0, 1, 2, -1]])
    prob = torch.tensor([[0.9, 0.5, 0.6, 0.4, 0.3, 0.2]])
    return Candidates(
        tokens=torch.arange(6).view(1, 6),
        parents=parents,
        path_prob=prob,
        valid=torch.ones((1, 6), dtype=torch.bool),
    )


def two_chains() -> Candidates:
    """Two requests, each a chain of 4 nodes with f = .9, .8, .7, .6."""
    return Candidates(
        tokens=torch.arange(4).repeat(2, 1),
        parents=torch.tensor([[-1, 0, 1, 2]] * 2),
        path_prob=torch.tensor([[0.9, 0.8, 0.7, 0.6]] * 2),
        valid=torch.ones((2, 4), dtype=torch.bool),
    )


def test_restrict_to_depth_and_width_keeps_a_beam():
    kept = restrict_to_shape(chain_and_fan(), depth=2, width=1).valid[0].tolist()
    # Level 1: best of {0, 1, 5} is 0; level 2: children of kept nodes -> 2 only.
    assert kept == [True, False, True, False, False, False]
    kept = restrict_to_shape(chain_and_fan(), depth=3, width=2).valid[0].tolist()
    # Level 1: 0 and 1; level 2: 2 and 3 (children of kept); level 3: 4.
    assert kept == [True, True, True, True, True, False]


def test_plan_follows_load_and_defaults_to_no_budget():
    cands = chain_and_fan()
    policy = AdaservePolicy(AdaserveConfig(tree=AdaptiveTreeConfig(max_depth=3, max_width=2)))
    plan = policy.plan(cands)
    assert (plan.depth, plan.width) == (3, 2)
    assert plan.budget == cands.num_requests * (cands.num_nodes + 1)
    assert AdaservePolicy(AdaserveConfig(budget=3)).plan(cands).budget == 3


def test_tight_request_gets_its_quota_first_under_budget():
    cands = two_chains()
    slo = SloBatch(
        tpot_slo_ms=torch.tensor([math.nan, 10.0], dtype=torch.float64),
        decode_elapsed_ms=torch.tensor([100.0, 100.0], dtype=torch.float64),
        tokens_out=torch.tensor([5.0, 5.0], dtype=torch.float64),
    )
    # The paper's SLO phase (Algorithm 2, no per-request cap: the knee rule).
    policy = AdaservePolicy(AdaserveConfig(budget=5, budget_rule="knee"))
    policy.observe_iteration(10.0)
    selection, required, *_ = policy.select(cands, slo)
    assert required.tolist() == [0.0, pytest.approx(6.0)]  # (100 + 10) / 10 - 5
    assert selection.counts.tolist() == [0, 3]  # 5 - 2 roots, all to the late request


def test_cost_rule_slo_phase_skips_a_request_too_far_behind_to_catch_up_this_iteration():
    cands = two_chains()  # each tree commits 1 + .9 + .8 + .7 + .6 = 4.0 tokens expected
    slo = SloBatch(
        tpot_slo_ms=torch.tensor([10.0, 10.0], dtype=torch.float64),
        decode_elapsed_ms=torch.tensor([140.0, 65.0], dtype=torch.float64),
        tokens_out=torch.tensor([5.0, 5.0], dtype=torch.float64),
    )
    # A(r) = (elapsed + 10) / 10 - 5: 10 tokens (beyond its tree's 4.0) and 2.5.
    paper = AdaservePolicy(AdaserveConfig(budget=5, budget_rule="knee"))
    paper.observe_iteration(10.0)
    assert paper.select(cands, slo)[0].counts.tolist() == [3, 0]  # most behind first, all
    policy = AdaservePolicy(AdaserveConfig(budget=5, budget_rule="cost"))
    policy.observe_iteration(10.0)
    selection, required, *_ = policy.select(cands, slo)
    assert required.tolist() == [pytest.approx(10.0), pytest.approx(2.5)]
    # Request 0 is served as best effort; request 1 takes the .9 and .8 nodes that put it back
    # on track (1 + 1.7 >= 2.5); the last node of the budget goes batch-wide by f, to request
    # 0's .9.
    assert selection.slo_counts.tolist() == [0, 2]
    assert selection.counts.tolist() == [1, 2]


def test_cost_rule_throughput_phase_prefers_a_request_on_its_line_to_one_far_ahead():
    cands = two_chains()  # .9, .8, .7, .6 each
    # Request 0 at 0.4x its SLO so far, request 1 on its line: neither needs an SLO-phase node
    # (A = (20 + 10) / 10 - 5 = -2 and (50 + 10) / 10 - 5 = 1, the bonus token's).
    slo = SloBatch(
        tpot_slo_ms=torch.tensor([10.0, 10.0], dtype=torch.float64),
        decode_elapsed_ms=torch.tensor([20.0, 50.0], dtype=torch.float64),
        tokens_out=torch.tensor([5.0, 5.0], dtype=torch.float64),
    )
    counts, one_node_gain = {}, {}
    for floor in (1.0, 0.5):
        policy = AdaservePolicy(AdaserveConfig(budget=5, budget_rule="cost", lead_floor=floor))
        policy.observe_iteration(10.0)
        counts[floor] = policy.select(cands, slo)[0].counts.tolist()
        # The gain table reads the draft as `observe` does, after the verify.
        policy.gain.observe(*policy.iteration_launched(warm=True).unread_draft)
        policy.gain.refresh(lambda f: f)
        one_node_gain[floor] = policy.gain.curve(4, 1)[1].item()
    # By f' alone the 3 nodes go .9 (request 0, the tie's lower index), .9, .8 (request 0);
    # request 0's nodes weighted 0.5 (the floor of exp(-(ln 0.4 / 0.3)^2 / 2) = 0.0094) rank
    # below request 1's .9 .8 .7.
    assert counts == {1.0: [2, 1], 0.5: [0, 3]}
    # The gain table pools as the selection ranks: one node per request, batch-wide, is both
    # .9s by f' alone and request 1's .9 and .8 weighted.
    assert one_node_gain == {1.0: pytest.approx(0.9), 0.5: pytest.approx(0.85)}
    with pytest.raises(ValueError, match="lead_floor"):
        AdaserveConfig(lead_floor=0.0)


def test_cost_rule_asks_a_for_the_wall_time_prefill_stalls_included():
    """Requests that waited on prefills 8 ms for every 10 ms of decode iterations must commit
    at 1.8x their SLO's pace while they decode: A(r) = (elapsed + 1.8 t_spec) / SLO - out."""
    policy = AdaservePolicy(AdaserveConfig(budget=5, budget_rule="cost"))
    for _ in range(3):
        policy.observe(
            make_outcome(
                None, None, rids=("r0", "r1"), context_tokens=200, accepted=torch.ones(2),
                verify_ms=9.0, iteration_ms=10.0, stall_ms=8.0,
            )
        )  # fmt: skip
    assert policy.wall_per_decode == pytest.approx(1.8)
    policy.observe_iteration(10.0)
    slo = SloBatch(
        tpot_slo_ms=torch.tensor([10.0, 10.0], dtype=torch.float64),
        decode_elapsed_ms=torch.tensor([50.0, 60.0], dtype=torch.float64),
        tokens_out=torch.tensor([5.0, 5.0], dtype=torch.float64),
    )
    _, required, *_ = policy.select(two_chains(), slo)
    assert required.tolist() == pytest.approx([1.8, 2.8])  # (50 + 18) / 10 - 5, (60 + 18) ...
    # The paper's rule (knee) keeps AdaServe's A(r) over one iteration.
    paper = AdaservePolicy(AdaserveConfig(budget=5, budget_rule="knee"))
    paper.observe_iteration(10.0)
    assert paper.select(two_chains(), slo)[1].tolist() == pytest.approx([1.0, 2.0])


def test_latency_estimates_are_smoothed_and_baseline_can_be_pinned():
    policy = AdaservePolicy(AdaserveConfig(latency_smoothing=0.5))
    assert policy.baseline_tpot_ms() is None
    policy.observe_verify(10.0)
    policy.observe_verify(20.0)
    assert policy.baseline_tpot_ms() == pytest.approx(15.0)
    pinned = AdaservePolicy(AdaserveConfig(baseline_tpot_ms=7.0))
    pinned.observe_verify(20.0)
    assert pinned.baseline_tpot_ms() == 7.0


def test_relative_slo_resolves_only_with_a_baseline():
    coding = RequestSlo("coding", baseline_multiple=1.2)
    assert coding.resolve_ms(None) is None
    assert coding.resolve_ms(20.0) == pytest.approx(24.0)
    assert RequestSlo("best_effort").resolve_ms(20.0) is None


def test_stats_attainment_per_class():
    stats = SpecStats()
    stats.observe_finished("chat", 40.0, 50.0)
    stats.observe_finished("chat", 60.0, 50.0)
    stats.observe_finished("best_effort", 99.0, None)
    stats.observe_iteration([3, 1], [2, 1], budget=4, depth=3, width=2)
    report = stats.as_dict()
    assert report["classes"]["chat"] == {
        "finished": 2, "met": 1, "attainment": 0.5, "mean_tpot_ms": 50.0, "infeasible": 0,
    }  # fmt: skip
    assert report["classes"]["best_effort"]["attainment"] == 1.0
    assert report["verified_tokens_per_iteration"] == 4
    assert report["accepted_tokens_per_verify"] == 1.5


def test_request_that_cannot_meet_its_slo_even_alone_is_served_best_effort():
    cands = two_chains()
    # t_spec 40 ms, depth 4 (tree) -> at best 40 / 5 = 8 ms per token.
    slo = SloBatch(
        tpot_slo_ms=torch.tensor([2.0, 20.0], dtype=torch.float64),  # 2 ms: hopeless
        decode_elapsed_ms=torch.tensor([400.0, 400.0], dtype=torch.float64),
        tokens_out=torch.tensor([5.0, 5.0], dtype=torch.float64),
    )
    config = AdaserveConfig(budget=5, tree=AdaptiveTreeConfig(max_depth=4), budget_rule="knee")
    policy = AdaservePolicy(config)
    policy.observe_iteration(40.0)
    selection, required, plan, _ = policy.select(cands, slo)
    assert policy._infeasible(slo, plan.depth).tolist() == [True, False]
    assert required[0] == 0.0 and required[1] > 0
    assert selection.counts.tolist() == [0, 3]  # the budget goes to the request it can help


def test_draft_shape_follows_load_within_the_configured_search():
    tree = AdaptiveTreeConfig(verify_tokens_per_step=16, draft_tokens_per_step=8)
    policy = AdaservePolicy(AdaserveConfig(tree=tree, budget_rule="knee"))  # eq. 8-9
    # n = 1: d = 15 and w = 8 clipped to the configured (4, 4); n = 4: (3, 2); n = 8: (1, 1).
    assert policy.draft_shape(1, 4, 4) == (4, 4)
    assert policy.draft_shape(4, 4, 4) == (3, 2)
    assert policy.draft_shape(8, 4, 4) == (1, 1)
    assert policy.draft_shape(4, 2, 1) == (2, 1)


def test_server_policy_takes_b1_from_the_verify_budget_unless_set():
    from sgl_adaspec.config import AdaspecConfig
    from sgl_adaspec.speculative.policies import build_policy

    knee = build_policy(AdaspecConfig.of(spec_policy="adaserve"), budget=48)
    assert knee.config.tree.verify_tokens_per_step == 48
    flag = build_policy(
        AdaspecConfig.of(
            spec_policy="adaserve", adaserve_budget=32, adaserve_draft_tokens_per_step=8
        )
    )
    assert (flag.config.tree.verify_tokens_per_step, flag.config.tree.draft_tokens_per_step) == (
        32,
        8,
    )
    own = build_policy(
        AdaspecConfig.of(
            spec_policy="adaserve", adaserve_budget_rule="knee", adaserve_verify_tokens_per_step=20
        ),
        budget=48,
    )
    assert (own.config.budget, own.config.tree.verify_tokens_per_step) == (48, 20)
    assert (
        build_policy(AdaspecConfig(spec_policy="adaserve")).config.tree.verify_tokens_per_step
        == 256
    )


def test_the_decision_carries_the_calibrations_prediction_that_observe_would_compute():
    """adaserve computes f' for its selection anyway: the outcome carries their sum, and the
    statistics read it instead of calibrating the verified nodes again. It must be what the
    calibration, as it stands before learning from this outcome, predicts for them."""
    from tests.speculative.policy_inputs import iteration_input

    policy = AdaservePolicy(AdaserveConfig(budget=5, budget_rule="cost"))
    # A calibration that is not the identity: f .9 / .7 accepted, .8 / .6 not.
    f = torch.tensor([[0.9, 0.8, 0.7, 0.6]], dtype=torch.float64)
    policy.acceptance.observe(f, torch.tensor([[True, False, True, False]]))
    it = iteration_input(two_chains(), draft_depth=4, tpot_slo_ms=[10.0, 50.0])
    decision = policy.decide(it)
    outcome = make_outcome(
        it, decision, rids=it.rids, context_tokens=200, accepted=torch.tensor([3, 2]),
        verify_ms=9.0, iteration_ms=10.0,
    )  # fmt: skip
    expected = policy.acceptance.calibrated_sum(outcome.verified_f)
    assert expected != pytest.approx(float(outcome.verified_f.sum()))  # calibrated, not raw f
    assert outcome.predicted_accepted == expected
    before = policy.stats.predicted_calibrated
    policy.observe(outcome)
    assert policy.stats.predicted_calibrated == pytest.approx(0.98 * before + expected)
