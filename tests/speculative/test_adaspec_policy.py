"""The adaspec policy: AdaSpec's throughput estimate, adaptive drafter, confidence-prior verifier
and SLO check on hand-computed cases, then the policy object end to end on CPU."""

from __future__ import annotations

import math

import pytest
import torch
from policy_inputs import iteration_input

from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.latency import VerifyLatency
from sgl_adaspec.speculative.policies.adaspec import (
    AdaspecPolicy,
    AdaspecPolicyConfig,
    IterationCost,
    confidence_prior_prune,
    drafter_depth,
    estimate_throughput,
    infeasible_requests,
)
from sgl_adaspec.speculative.policies.base import IterationInput

INF = math.inf


def linear_cost(draft_step_ms: float, base_ms: float, per_token_ms: float, max_tokens: int = 16):
    """T_sd(k, n) = k * draft_step_ms + base_ms + per_token_ms * n."""
    n = torch.arange(max_tokens + 1, dtype=torch.float64)
    return IterationCost(draft_step_ms, base_ms + per_token_ms * n)


def ars(*rows: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, D] AR and [B] lengths from per-request chains (all of length D)."""
    ar = torch.tensor(rows, dtype=torch.float64)
    return ar, torch.full((ar.shape[0],), ar.shape[1], dtype=torch.int64)


def slo(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


# --- Alg. 3: the estimate -------------------------------------------------------------------


def test_throughput_estimate_by_hand():
    cost = linear_cost(draft_step_ms=2.0, base_ms=10.0, per_token_ms=1.0)
    accepted = torch.tensor([1.9, 1.5], dtype=torch.float64)
    tokens = torch.tensor(2)
    # T = 1 * 2 + 10 + 2 * 1 = 14 ms; NAT = 3.4.
    free = estimate_throughput(accepted, tokens, 1, cost, slo(INF, math.nan))
    assert float(free) == pytest.approx(3.4 / 14)
    # Request 0's TPOT 14 / 1.9 = 7.37 ms: meets 8 ms, misses 7 ms -> invalid, below every valid.
    assert float(estimate_throughput(accepted, tokens, 1, cost, slo(8.0, INF))) == pytest.approx(
        3.4 / 14
    )
    invalid = float(estimate_throughput(accepted, tokens, 1, cost, slo(7.0, INF)))
    assert invalid == pytest.approx(-1 / (1 + 3.4 / 14)) and -1 < invalid < 0


def test_throughput_estimate_is_batched():
    cost = linear_cost(0.0, 10.0, 1.0)
    accepted = torch.tensor([[2.0, 1.0], [1.0, 1.0]], dtype=torch.float64)  # [2 configs, B]
    got = estimate_throughput(accepted, torch.tensor([1, 0]), 0, cost, slo(INF, INF))
    assert got.tolist() == pytest.approx([3 / 11, 2 / 10])


# --- Alg. 1: the adaptive drafter -----------------------------------------------------------


def conditional(ar: torch.Tensor) -> torch.Tensor:
    """Per-step confidence c with cumprod(c) = ar (a perfect history)."""
    prev = torch.cat([torch.ones_like(ar[:, :1]), ar[:, :-1]], dim=1)
    return (ar / prev)[0]


def test_drafter_stops_at_the_first_local_maximum():
    ar, lengths = ars([0.9, 0.8, 0.7, 0.6])
    # A verify table with a dip at 4 tokens: k = 4 would be best (4.0 / 12.5 = .32), but the walk
    # stops at the first local maximum, k = 2: 1/10, 1.9/11 = .173, 2.7/12 = .225, 3.4/20 = .17.
    cost = IterationCost(0.0, torch.tensor([10.0, 11.0, 12.0, 20.0, 12.5], dtype=torch.float64))
    assert drafter_depth(ar, lengths, conditional(ar), cost, slo(INF)) == 2
    # min_depth forces the walk to start deeper; from k = 3 the next step pays (.32 > .17).
    assert drafter_depth(ar, lengths, conditional(ar), cost, slo(INF), min_depth=3) == 4


def test_drafter_decides_on_the_prediction_not_the_real_confidence():
    ar, lengths = ars([0.9, 0.8, 0.7, 0.6])
    cost = linear_cost(0.0, 10.0, 1.0)
    # Real AR pays at every depth (1/10 < 1.9/11 < 2.7/12 < 3.4/13 < 4/14) ...
    assert drafter_depth(ar, lengths, conditional(ar), cost, slo(INF)) == 4
    # ... but a pessimistic history (c = .1: 1.1/11 is not above 1/10) never takes the first step.
    pessimistic = torch.full((4,), 0.1, dtype=torch.float64)
    assert drafter_depth(ar, lengths, pessimistic, cost, slo(INF)) == 0
    # Correct: after step 1 is taken on a guess of .5 (1.5/11 > .1), step 2's guess builds on the
    # real AR_1 = .9 (.9 * .5: 2.35/12 > 1.9/11), not on the guessed .5 (.25: 2.0/12 < 1.9/11).
    half_then_low = torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64)
    assert drafter_depth(ar, lengths, half_then_low, cost, slo(INF)) == 2


def slo_batch() -> tuple[torch.Tensor, torch.Tensor, IterationCost]:
    """Two requests; T_sd(k, n) = k + 10 + n ms. Unconstrained goodput by depth k:
    k=0: 2/10 = .2; k=1: 3.2/13 = .246; k=2: 4.15/16 = .259; k=3: 5/19 = .263.
    Request 1's TPOT by depth: 10/1 = 10, 13/1.3 = 10, 16/1.4 = 11.43, 19/1.45 = 13.1."""
    ar, lengths = ars([0.9, 0.85, 0.8], [0.3, 0.1, 0.05])
    return ar, lengths, linear_cost(1.0, 10.0, 1.0)


def test_slo_invalidity_stops_the_drafter():
    ar, lengths, cost = slo_batch()
    predicted = torch.ones(3, dtype=torch.float64)
    assert drafter_depth(ar, lengths, predicted, cost, slo(INF, INF)) == 3
    # 10.5 ms for request 1: k = 2 breaks it (11.43). The optimistic guess (c = 1: 16/1.6 = 10)
    # takes the step anyway and the walk goes on among invalid depths, but the depth used is the
    # best one reached: k = 1.
    assert drafter_depth(ar, lengths, predicted, cost, slo(INF, 10.5)) == 1
    # A history of c = .6 does not even take step 2: its guess, 16/1.48 = 10.8 ms, is invalid.
    cautious = torch.full((3,), 0.6, dtype=torch.float64)
    assert drafter_depth(ar, lengths, cautious, cost, slo(INF, 10.5)) == 1


def test_when_nothing_is_valid_the_drafter_still_maximizes_throughput():
    ar, lengths, cost = slo_batch()
    # 4 ms for request 0 is missed at every depth (best 19 / 3.55 = 5.35 at k = 3).
    assert drafter_depth(ar, lengths, torch.ones(3, dtype=torch.float64), cost, slo(4.0, INF)) == 3


# --- Alg. 2: the confidence-prior verifier --------------------------------------------------


def test_verifier_drops_lowest_ar_tails_and_stops_when_throughput_would_fall():
    ar, lengths = ars([0.9, 0.8, 0.7], [0.5, 0.1, 0.05])
    cost = linear_cost(0.0, 10.0, 1.0)
    # All kept: 5.05/16 = .316. Drop .05: 5.0/15 = .333; drop .1: 4.9/14 = .35; dropping .5
    # next (4.4/13 = .338) would lower it: stop. Request 0 is untouched.
    assert confidence_prior_prune(ar, lengths, 3, cost, slo(INF, INF)).tolist() == [3, 1]
    # Free tokens: nothing is dropped; costly ones (5 ms each): everything is.
    free, costly = linear_cost(0.0, 10.0, 0.0), linear_cost(0.0, 10.0, 5.0)
    assert confidence_prior_prune(ar, lengths, 3, free, slo(INF, INF)).tolist() == [3, 3]
    assert confidence_prior_prune(ar, lengths, 3, costly, slo(INF, INF)).tolist() == [0, 0]


def test_verifier_drops_the_tail_of_equal_ar_chains():
    # Equal AR along a chain: the deepest goes first, so the kept tokens stay a prefix; and the
    # drop counts follow AR, not request order (request 1's .3 goes before request 0's .4).
    ar, lengths = ars([0.4, 0.4], [0.9, 0.3])
    cost = linear_cost(0.0, 10.0, 4.0)
    # All kept: 3.0/26 = .115; -.3: 2.7/22 = .123; -.4: 2.3/18 = .128; -.4: 1.9/14 = .136;
    # -.9: 1/10 = .1 -> stop after three drops.
    assert confidence_prior_prune(ar, lengths, 2, cost, slo(INF, INF)).tolist() == [0, 1]


def test_slo_invalidity_stops_the_verifier():
    # T = 10 + 2n. All kept: 4.2/18 = .233; drop .2: 4.0/16 = .25; drop .3: 3.7/14 = .264;
    # drop .8: 2.9/12 = .242 -> [2, 0]. Request 1's TPOT grows with each drop: 12, 12.31, 14.
    ar, lengths = ars([0.9, 0.8], [0.3, 0.2])
    cost = linear_cost(0.0, 10.0, 2.0)
    assert confidence_prior_prune(ar, lengths, 2, cost, slo(INF, INF)).tolist() == [2, 0]
    assert confidence_prior_prune(ar, lengths, 2, cost, slo(INF, 13.0)).tolist() == [2, 1]
    assert confidence_prior_prune(ar, lengths, 2, cost, slo(INF, 12.2)).tolist() == [2, 2]


def test_infeasible_requests():
    ar, lengths, cost = slo_batch()
    # Request 0 alone, j tokens: 10/1, 12/1.9, 14/2.75, 16/3.55 = 4.51 -> 5 ms is reachable.
    # Request 1 alone: 10/1, 12/1.3 = 9.23, 14/1.4, 16/1.45 -> 5 ms is not; 9.5 ms is.
    assert infeasible_requests(ar, lengths, cost, slo(5.0, 5.0)).tolist() == [False, True]
    assert infeasible_requests(ar, lengths, cost, slo(5.0, 9.5)).tolist() == [False, False]
    assert infeasible_requests(ar, lengths, cost, slo(math.nan, INF)).tolist() == [False, False]
    # With at least 3 draft steps, request 0's j = 0 costs 13 ms: 4.51 is still its best.
    assert infeasible_requests(ar, lengths, cost, slo(4.6, INF), min_depth=3).tolist() == [
        False,
        False,
    ]
    assert infeasible_requests(ar, lengths, cost, slo(4.5, INF), min_depth=3).tolist() == [
        True,
        False,
    ]


# --- the policy object ----------------------------------------------------------------------


def chains(*probs: list[float], extra_branch: bool = False) -> Candidates:
    """One chain of path probabilities per request; with extra_branch, also a low-f sibling of
    the first node (the policy must ignore it: it verifies chains only)."""
    depth = len(probs[0])
    parents = [-1] + list(range(depth - 1))
    rows = [list(p) for p in probs]
    if extra_branch:
        parents = parents + [-1]
        rows = [p + [0.01] for p in rows]
    bsz = len(rows)
    return Candidates(
        tokens=torch.arange(len(parents)).repeat(bsz, 1),
        parents=torch.tensor([parents] * bsz),
        path_prob=torch.tensor(rows),
        valid=torch.ones((bsz, len(parents)), dtype=torch.bool),
    )


def iteration(cands: Candidates, tpot: list[float], draft_depth: int = 2) -> IterationInput:
    return iteration_input(cands, draft_depth, tpot_slo_ms=tpot)


def fitted_policy(config: AdaspecPolicyConfig | None = None) -> AdaspecPolicy:
    """Verify pass 6 + 2 * verified tokens (context has no effect), draft steps free: for a batch
    of two, T_sd = 10 + 2n as in `test_slo_invalidity_stops_the_verifier`."""
    latency = VerifyLatency()
    for tokens in range(2, 8):
        for context in (100, 300):
            latency.observe((tokens, context), 6.0 + 2.0 * tokens)
    return AdaspecPolicy(config or AdaspecPolicyConfig(), verify_latency=latency)


def test_config_is_validated():
    for bad in (
        {"confidence_smoothing": 0.0},
        {"confidence_smoothing": 1.5},
        {"min_depth": -1},
        {"latency_smoothing": 0.0},
        {"baseline_tpot_ms": 0.0},
    ):
        with pytest.raises(ValueError):
            AdaspecPolicyConfig(**bad)
    policy = AdaspecPolicy(AdaspecPolicyConfig(latency_smoothing=0.5, baseline_tpot_ms=7.0))
    assert policy.latency_smoothing == 0.5 and policy.baseline_tpot_ms() == 7.0


def test_cost_table_matches_the_latency_model():
    policy = fitted_policy()
    policy.observe_verify(30.0, 4, 250)
    it = iteration(chains([0.9, 0.8], [0.3, 0.2]), [INF, INF])
    cost = policy.iteration_cost(it, 4)
    expected = [policy.predict_verify_ms(2 + n, 200) for n in range(5)]
    assert cost.verify_ms.tolist() == pytest.approx(expected)
    assert cost.draft_step_ms == 0.0


def test_without_measurements_every_chain_token_is_verified():
    cands = chains([0.9, 0.8, 0.1], [0.3, 0.2, 0.1], extra_branch=True)
    decision = AdaspecPolicy().decide(iteration(cands, [1.0, INF], draft_depth=2))
    # Chains cut at the draft's 2 steps; the sibling branch (node 3) is never selected.
    assert decision.selection.mask.tolist() == [[True, True, False, False]] * 2
    assert (decision.depth, decision.width, decision.budget) == (2, 1, 6)
    assert decision.infeasible.tolist() == [False, False]


def test_decide_follows_the_slo():
    cands = chains([0.9, 0.8], [0.3, 0.2], extra_branch=True)
    counts = {}
    for name, tpot, config in (
        ("free", [INF, INF], AdaspecPolicyConfig()),
        ("loose", [INF, 13.0], AdaspecPolicyConfig()),
        ("tight", [INF, 12.2], AdaspecPolicyConfig()),
        ("ignored", [INF, 12.2], AdaspecPolicyConfig(slo_aware=False)),
    ):
        decision = fitted_policy(config).decide(iteration(cands, tpot))
        assert decision.depth == 2 and decision.infeasible.tolist() == [False, False]
        counts[name] = decision.selection.counts.tolist()
        assert decision.budget == 2 + sum(counts[name])
    assert counts == {"free": [2, 0], "loose": [2, 1], "tight": [2, 2], "ignored": [2, 0]}


def test_decide_marks_hopeless_requests_and_serves_them_best_effort():
    cands = chains([0.9, 0.8], [0.3, 0.2])
    # Request 1 alone at best: 10/1, 12/1.3 = 9.2, 14/1.5 = 9.3 ms: 5 ms is out of reach.
    decision = fitted_policy().decide(iteration(cands, [INF, 5.0]))
    assert decision.infeasible.tolist() == [False, True]
    assert decision.selection.counts.tolist() == [2, 0]  # as if it had no SLO
    unaware = fitted_policy(AdaspecPolicyConfig(slo_aware=False))
    assert unaware.decide(iteration(cands, [INF, 5.0])).infeasible.tolist() == [False, False]


def random_trees(seed: int, bsz: int = 5, num_nodes: int = 12) -> Candidates:
    gen = torch.Generator().manual_seed(seed)
    parents = torch.full((bsz, num_nodes), -1, dtype=torch.int64)
    prob = torch.zeros((bsz, num_nodes))
    for j in range(num_nodes):
        if j:
            parents[:, j] = torch.randint(-1, j, (bsz,), generator=gen)
        step = torch.rand(bsz, generator=gen)
        parent_slot = parents[:, j : j + 1].clamp(min=0)
        parent_prob = torch.where(parents[:, j] >= 0, prob.gather(1, parent_slot)[:, 0], 1.0)
        prob[:, j] = parent_prob * step
    valid = torch.rand((bsz, num_nodes), generator=gen) < 0.9
    valid[:, 0] = True
    for j in range(num_nodes):  # a node is valid only if its parent is
        has_parent = parents[:, j] >= 0
        valid[:, j] &= ~has_parent | valid.gather(1, parents[:, j : j + 1].clamp(min=0))[:, 0]
    return Candidates(torch.zeros_like(parents), parents, prob, valid)


@pytest.mark.parametrize("seed", range(5))
def test_selection_is_a_closed_chain_and_deterministic(seed):
    cands = random_trees(seed)
    tpot = [INF, 30.0, 8.0, math.nan, 15.0]
    decisions = []
    for _ in range(2):
        policy = fitted_policy()
        verify_ms = policy.verify_latency.predict((5, 500))
        policy.observe_verify(verify_ms, 5, 500)
        policy.observe_iteration(verify_ms + 3.0, 3)  # 1 ms per draft step
        assert policy.draft_step_ms == pytest.approx(1.0)
        decisions.append(policy.decide(iteration(cands, tpot, draft_depth=4)))
    first, second = decisions
    assert torch.equal(first.selection.mask, second.selection.mask)
    assert torch.equal(first.infeasible, second.infeasible)
    assert (first.depth, first.budget) == (second.depth, second.budget)
    mask = first.selection.mask
    assert not bool((mask & ~cands.valid).any())
    parent_selected = mask.gather(1, cands.parents.clamp(min=0)) | (cands.parents < 0)
    assert bool((parent_selected | ~mask).all())  # closed under parent
    depth = torch.where(mask, cands.depth, 0)
    assert int(depth.max()) <= first.depth
    for row in range(cands.num_requests):  # one node per depth: a chain
        levels = depth[row][mask[row]]
        assert levels.tolist() == list(range(1, len(levels) + 1))


def test_confidence_history_is_a_running_mean_per_step():
    policy = fitted_policy(AdaspecPolicyConfig(confidence_smoothing=0.5))
    assert policy.predicted_confidence(2).tolist() == [1.0, 1.0]  # unseen: optimistic
    # c: request 0 (.9, .8), request 1 (.5, .2) -> per-step means (.7, .5).
    it = iteration(chains([0.9, 0.72], [0.5, 0.1]), [INF, INF])
    policy.decide(it)
    assert policy.predicted_confidence(3).tolist() == [1.0, 1.0, 1.0]  # not before the outcome
    outcome = (it.rids, torch.tensor([3, 1]), torch.tensor([2, 1]))
    policy.observe_outcome(*outcome)
    assert policy.predicted_confidence(3).tolist() == pytest.approx([0.7, 0.5, 1.0])
    # Next iteration c: (.9, .5) and (.3, 0) -> means (.6, .25), each moving the history halfway.
    policy.decide(iteration(chains([0.9, 0.45], [0.3, 0.0]), [INF, INF]))
    policy.observe_outcome(*outcome)
    assert policy.predicted_confidence(2).tolist() == pytest.approx([0.65, 0.375])


def test_draft_shape_is_a_chain_one_step_deeper_than_the_last_depth():
    policy = fitted_policy()
    assert policy.draft_shape(2, 4, 3) == (4, 1)  # nothing decided yet: the configured depth
    policy.observe_verify(30.0, 4, 250)
    tight = iteration(chains([0.9, 0.8], [0.3, 0.2]), [INF, 12.2])
    depth = policy.decide(tight).depth
    assert policy.draft_shape(2, 4, 3) == (min(depth + 1, 4), 1)
    policy._last_depth = 0  # speculation switched off: the next draft still probes one step
    assert policy.draft_shape(2, 4, 3) == (1, 1)
    floor = fitted_policy(AdaspecPolicyConfig(min_depth=3))
    floor._last_depth = 0
    assert floor.draft_shape(2, 4, 3) == (3, 1)
