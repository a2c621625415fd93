"""The faser policy: GP posterior and cost by hand, GP-LCB exploration and convergence, the
per-request sliding window, per-request lengths in one batch, refused flags, selection closure."""

from __future__ import annotations

import math
from collections import Counter, deque

import pytest
import torch

from sgl_adaspec.scheduler.slo import SloBatch
from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.policies.base import IterationInput
from sgl_adaspec.speculative.policies.faser import (
    EXIT_PROBE_INTERVAL,
    FaserConfig,
    FaserPolicy,
    Observation,
    cost_per_committed_token,
    gp_posterior,
    lcb_argmin,
    window_statistics,
)

DRAFT_MS = 1.0  # per draft step


def chains(bsz: int, depth: int) -> Candidates:
    """bsz requests, each a chain of `depth` nodes with f = .9, .81, ..."""
    return Candidates(
        tokens=torch.arange(depth).repeat(bsz, 1),
        parents=torch.tensor([[-1] + list(range(depth - 1))] * bsz),
        path_prob=torch.tensor([[0.9 ** (i + 1) for i in range(depth)]] * bsz),
        valid=torch.ones((bsz, depth), dtype=torch.bool),
    )


def chain_and_fan() -> Candidates:
    """One request: root -> 0 (f .9) -> 2 (.6) -> 4 (.3); root -> 1 (.5) -> 3 (.4);
    root -> 5 (.2). Most probable chain: 0, 2, 4."""
    return Candidates(
        tokens=torch.arange(6).view(1, 6),
        parents=torch.tensor([[-1, -1, 0, 1, 2, -1]]),
        path_prob=torch.tensor([[0.9, 0.5, 0.6, 0.4, 0.3, 0.2]]),
        valid=torch.ones((1, 6), dtype=torch.bool),
    )


def iteration(rids: tuple[str, ...], cands: Candidates, draft_depth: int) -> IterationInput:
    bsz = len(rids)
    slo = SloBatch(
        tpot_slo_ms=torch.full((bsz,), math.nan, dtype=torch.float64),
        decode_elapsed_ms=torch.zeros(bsz, dtype=torch.float64),
        tokens_out=torch.zeros(bsz),
    )
    return IterationInput(cands, slo, rids, 100 * bsz, draft_depth, 1)


def run(policy: FaserPolicy, rids: tuple[str, ...], accept, steps: int, draft_depth: int = 5,
        ms_per_token: float = 2.0) -> list[list[int]]:
    """Drive the adapter's loop `steps` times. accept(rid, s) -> draft tokens accepted; verify
    latency 10 + ms_per_token * verified tokens. Returns each iteration's lengths."""
    history = []
    for _ in range(steps):
        decision = policy.decide(iteration(rids, chains(len(rids), draft_depth), draft_depth))
        lengths = decision.selection.counts.tolist()
        verified = torch.tensor(lengths) + 1
        verify_ms = 10.0 + ms_per_token * float(verified.sum())
        policy.observe_verify(verify_ms, int(verified.sum()), 100 * len(rids))
        accepted = torch.tensor([accept(r, s) + 1 for r, s in zip(rids, lengths)])  # + bonus
        policy.observe_outcome(rids, verified, accepted)
        policy.observe_iteration(verify_ms + DRAFT_MS * draft_depth, draft_depth)
        history.append(lengths)
    return history


# ---- pure math by hand ----


def test_gp_posterior_one_point_by_hand():
    # One observation y = 2 at s = 1, noise variance .5, unit prior, lengthscale 1.
    x, y, nv = torch.tensor([[1.0]]), torch.tensor([[2.0]]), torch.tensor([[0.5]])
    mask = torch.tensor([[True]])
    mean, var = gp_posterior(x, y, nv, mask, torch.tensor([1.0, 2.0]), lengthscale=1.0)
    k = math.exp(-0.5)  # k(1, 2)
    assert mean[0].tolist() == pytest.approx([2 / 1.5, k * 2 / 1.5])
    assert var[0].tolist() == pytest.approx([1 - 1 / 1.5, 1 - k * k / 1.5])


def test_gp_posterior_two_points_by_hand_and_masked_slots_are_ignored():
    # y = 1 at s = 0, y = 0 at s = 1, no noise: K = [[1, a], [a, 1]], a = exp(-1/2).
    a, c = math.exp(-0.5), math.exp(-2.0)  # k(0, 1), k(0, 2)
    # Query s = 2: k* = (c, a); K^-1 y = (1, -a) / (1 - a^2).
    want_mean = (c - a * a) / (1 - a * a)
    want_var = 1 - (c * c - 2 * a * a * c + a * a) / (1 - a * a)
    # A third slot with garbage values, masked out, must change nothing.
    x = torch.tensor([[0.0, 1.0, 7.0]], dtype=torch.float64)
    y = torch.tensor([[1.0, 0.0, 99.0]], dtype=torch.float64)
    nv = torch.tensor([[0.0, 0.0, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False]])
    query = torch.tensor([0.0, 2.0], dtype=torch.float64)
    mean, var = gp_posterior(x, y, nv, mask, query, lengthscale=1.0)
    assert mean[0].tolist() == pytest.approx([1.0, want_mean], abs=1e-9)
    assert var[0].tolist() == pytest.approx([0.0, want_var], abs=1e-9)
    # No observation at all: the prior everywhere.
    mean, var = gp_posterior(x, y, nv, torch.zeros_like(mask), query, lengthscale=1.0)
    assert mean.tolist() == [[0.0, 0.0]] and var.tolist() == [[1.0, 1.0]]


def test_cost_and_window_statistics_by_hand():
    # Request 0 saw s = 2 twice (2 and 1 committed, 30 and 50 ms) and s = 1 once; slot 3 empty.
    obs_length = torch.tensor([[2, 1, 2, -1]])
    committed = torch.tensor([[2.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    latency = torch.tensor([[30.0, 20.0, 50.0, 0.0]], dtype=torch.float64)
    lengths = torch.tensor([1, 2, 3])
    count, c_mean, t_mean = window_statistics(obs_length, committed, latency, lengths)
    assert count.tolist() == [[1.0, 2.0, 0.0]]
    assert c_mean.tolist() == [[1.0, 1.5, 0.0]]
    assert t_mean.tolist() == [[20.0, 40.0, 0.0]]
    cost = cost_per_committed_token(t_mean, c_mean, eps=0.5)
    assert cost[0, :2].tolist() == pytest.approx([20 / 1.5, 40 / 2.0])
    # LCB: a tie goes to the shortest length; a wide sigma beats a slightly lower mean.
    assert lcb_argmin(torch.tensor([[0.0, 0.0]]), torch.tensor([[1.0, 1.0]]), 1.0).tolist() == [0]
    assert lcb_argmin(torch.tensor([[0.0, 0.3]]), torch.tensor([[0.01, 1.0]]), 1.0).tolist() == [1]


# ---- the policy ----


def test_lcb_explores_unobserved_lengths_first_then_settles_on_the_cheapest():
    # Acceptance saturates at 2 drafts: longer lengths only add verify cost.
    # T(s) = 5 draft + 10 + 2 (s + 1) -> J = T / (min(s, 2) + .1) is least at s = 2.
    policy = FaserPolicy(FaserConfig(window=32))
    history = [h[0] for h in run(policy, ("a",), lambda _r, s: min(s, 2), steps=30)]
    assert sorted(history[:5]) == [1, 2, 3, 4, 5]  # each length tried once before any repeat
    assert Counter(history[-10:]).most_common(1)[0][0] == 2
    cost, count = policy.costs(iteration(("a",), chains(1, 5), 5), torch.arange(1, 6))
    assert bool((count > 0).all()) and int(cost.argmin()) == 1  # s = 2


def test_window_slides_and_counts_committed_without_the_bonus():
    policy = FaserPolicy(FaserConfig(window=3))
    run(policy, ("a",), lambda _r, s: s, steps=5)
    window = policy.window("a")
    assert len(window) == 3
    assert all(o.committed == o.length for o in window)  # accept length s + 1 -> s committed
    assert all(o.batch_size == 1 and o.latency_ms > 0 for o in window)
    before = [o.length for o in window]
    run(policy, ("a",), lambda _r, s: s, steps=1)
    assert [o.length for o in policy.window("a")][:2] == before[1:]  # oldest dropped


def test_forget_drops_all_request_state():
    policy = FaserPolicy()
    run(policy, ("a", "b"), lambda _r, s: s, steps=3)
    policy.decide(iteration(("a", "b"), chains(2, 5), 5))
    policy.observe_outcome(("a", "b"), torch.tensor([2, 2]), torch.tensor([2, 2]))  # pending
    policy.forget("a")
    assert policy.window("a") == () and "a" not in policy._chosen
    policy.observe_iteration(20.0, 5)
    assert policy.window("a") == ()  # the pending outcome did not bring it back
    assert len(policy.window("b")) == 4


def test_requests_in_one_batch_get_their_own_lengths():
    # Cheap verify (.5 ms per token): "easy" accepts every draft, so long is best for it;
    # "hard" never gets past one draft, so extra length only costs.
    accept = {"easy": lambda s: s, "hard": lambda s: min(s, 1)}
    policy = FaserPolicy(FaserConfig(window=32))
    history = run(policy, ("easy", "hard"), lambda r, s: accept[r](s), 40, ms_per_token=0.5)
    easy = Counter(h[0] for h in history[-10:]).most_common(1)[0][0]
    hard = Counter(h[1] for h in history[-10:]).most_common(1)[0][0]
    assert (easy, hard) == (5, 1)


def test_unavailable_mechanisms_and_bad_settings_are_refused():
    with pytest.raises(ValueError, match="early_exit must be one of off, auto, always"):
        FaserConfig(early_exit="sometimes")
    with pytest.raises(ValueError, match="exit_layer"):
        FaserConfig(early_exit="auto", exit_layer=0)
    with pytest.raises(ValueError, match="exit_topk"):
        FaserConfig(early_exit="auto", exit_topk=0)
    with pytest.raises(ValueError, match="SM partitions"):
        FaserConfig(overlap=True)
    with pytest.raises(ValueError, match=">= 1"):
        FaserConfig(lengths=(0, 2))
    with pytest.raises(ValueError, match="repeat"):
        FaserConfig(lengths=(2, 2))
    with pytest.raises(ValueError, match="window"):
        FaserConfig(window=0)
    with pytest.raises(ValueError, match="noise"):
        FaserConfig(noise=0.0)


def test_selection_is_a_chain_prefix_closed_under_parent():
    policy = FaserPolicy(FaserConfig(lengths=(2,)))
    cands = chain_and_fan()
    decision = policy.decide(iteration(("a",), cands, 3))
    mask = decision.selection.mask[0]
    assert mask.tolist() == [True, False, True, False, False, False]  # 0 -> 2
    parents = cands.parents[0]
    assert all(parents[j] < 0 or mask[parents[j]] for j in mask.nonzero().flatten().tolist())
    assert (decision.depth, decision.width, decision.budget) == (2, 1, 3)  # root + 2
    assert not bool(decision.infeasible.any())


def test_lengths_deeper_than_the_draft_are_clipped():
    policy = FaserPolicy(FaserConfig(lengths=(1, 4, 8)))
    assert policy.candidate_lengths(5) == (1, 4, 5)
    assert FaserPolicy().candidate_lengths(3) == (1, 2, 3)


def test_before_the_latency_model_the_observed_iteration_latency_is_used():
    policy = FaserPolicy()
    policy._windows["a"] = deque([Observation(1, 1.0, 12.0, 1), Observation(2, 2.0, 30.0, 1)])
    cost, count = policy.costs(iteration(("a",), chains(1, 2), 2), torch.tensor([1, 2]))
    assert count.tolist() == [[1.0, 1.0]]
    assert cost[0].tolist() == pytest.approx([12 / 1.1, 30 / 2.1])


def test_early_exit_plan_carries_the_expected_rejected_tokens():
    off = FaserPolicy(FaserConfig(lengths=(2,), window=8))
    auto = FaserPolicy(FaserConfig(lengths=(2,), window=8, early_exit="auto", exit_topk=3))
    always = FaserPolicy(FaserConfig(lengths=(2,), early_exit="always", exit_layer=5))
    # "a" commits 1 of its 2 draft tokens each iteration, "b" both.
    accept = {"a": 1, "b": 2}
    for policy in (off, auto):
        run(policy, ("a", "b"), lambda r, _s: accept[r], steps=3, draft_depth=2)
    assert off.decide(iteration(("a", "b"), chains(2, 2), 2)).early_exit is None
    # run()'s batches all verify 6 tokens; a few sizes more pin the latency model's slope.
    auto.verify_latency.seed([((t, 0), 10.0 + 2.0 * t) for t in (4, 8, 16)])
    plan = auto.decide(iteration(("a", "b"), chains(2, 2), 2)).early_exit
    # eq. 5-6: (2 - 1) + (2 - 2) = 1 expected rejected token.
    assert (plan.exit_layer, plan.topk, plan.expected_rejected, plan.forced) == (None, 3, 1.0, False)
    # The verify model's marginal price of a token (10 + 2 ms per verified token; run()'s own
    # passes and the ridge bend the fit a little) and, once a test was measured, its smoothed
    # latency per tested row.
    assert plan.verify_ms_per_token == pytest.approx(2.0, rel=0.1) and plan.test_ms_per_row is None
    auto.observe_early_exit(tested=4, exited=1, test_ms=2.0)
    auto.observe_early_exit(tested=2, exited=0, test_ms=2.0)
    assert auto.exit_test_ms_per_row == pytest.approx(0.7 * 0.5 + 0.3 * 1.0)
    assert auto.stats.exit_tested_tokens == 6 and auto.stats.exited_tokens == 1
    # Measured plans carry the cost; after EXIT_PROBE_INTERVAL plans without a test, one
    # plan leaves it unknown, so the adapter tests and measures again.
    plans = [auto.decide(iteration(("a", "b"), chains(2, 2), 2)).early_exit
             for _ in range(EXIT_PROBE_INTERVAL + 1)]
    assert [p.test_ms_per_row is None for p in plans] == [False] * EXIT_PROBE_INTERVAL + [True]
    # A new request has no history: half its length counts as rejected.
    plan = always.decide(iteration(("new",), chains(1, 2), 2)).early_exit
    assert (plan.exit_layer, plan.expected_rejected, plan.forced) == (5, 1.0, True)
