"""The dropin policy: the paper's formulas by hand, the FSM rules, windows as tree depth."""

from __future__ import annotations


import pytest
import torch

from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.policies.base import IterationInput
from policy_inputs import iteration_input
from sgl_adaspec.speculative.policies.dropin import (
    DropinConfig,
    DropinPolicy,
    DropinVariant,
    _tokens_upto,
    best_window,
    cache_fsm_step,
    expected_committed,
    fsm_step,
    mle_acceptance,
    window_gain,
)
from sgl_adaspec.speculative.shapes import restrict_to_shape


def chain(depth: int, rows: int = 1) -> Candidates:
    """`rows` requests, each a chain of `depth` nodes with f = .9, .8, ..."""
    prob = torch.tensor([0.9 - 0.1 * j for j in range(depth)]).repeat(rows, 1)
    return Candidates(
        tokens=torch.arange(depth).repeat(rows, 1),
        parents=torch.arange(-1, depth - 1).repeat(rows, 1),
        path_prob=prob,
        valid=torch.ones(rows, depth, dtype=torch.bool),
    )


def wide_tree() -> Candidates:
    """Two requests, the same width-2 tree of depth 3:
    root -> 0 (.9), 1 (.5); 0 -> 2 (.6), 3 (.4); 1 -> 4 (.3); 2 -> 5 (.5), 3 -> 6 (.2)."""
    return Candidates(
        tokens=torch.arange(7).repeat(2, 1),
        parents=torch.tensor([[-1, -1, 0, 0, 1, 2, 3]] * 2),
        path_prob=torch.tensor([[0.9, 0.5, 0.6, 0.4, 0.3, 0.5, 0.2]] * 2),
        valid=torch.ones(2, 7, dtype=torch.bool),
    )


def iteration(
    cands: Candidates, draft_depth: int, draft_width: int = 1, history=None
) -> IterationInput:
    return iteration_input(cands, draft_depth, draft_width, history=history)

def outcome(policy: DropinPolicy, *accepted: int) -> None:
    """Report SGLang accept lengths (bonus included) for requests r0, r1, ..."""
    rids = tuple(f"r{i}" for i in range(len(accepted)))
    accepted_t = torch.tensor(accepted)
    policy.observe_outcome(rids, accepted_t, accepted_t)


# --- the formulas --------------------------------------------------------------------------------


def test_mle_acceptance_by_hand():
    # V = 2, 4, 0 of windows 4, 4, 3: 6 successes, 2 rejections (2 < 4, 0 < 3) -> 6 / 8.
    assert mle_acceptance([2, 4, 0], [4, 4, 3], acc_max=0.98) == pytest.approx(0.75)
    # Only full acceptances: 8 / 8 = 1, capped.
    assert mle_acceptance([4, 4], [4, 4], acc_max=0.98) == 0.98
    assert mle_acceptance([0], [3], acc_max=0.98) == 0.0
    # No evidence: no verification, or only windows of 0.
    assert mle_acceptance([], [], acc_max=0.98) is None
    assert mle_acceptance([0, 0], [0, 0], acc_max=0.98) is None


def test_expected_committed_is_the_truncated_geometric_sum():
    windows = torch.tensor([0, 1, 2, 3])
    got = expected_committed(torch.tensor([0.5, 1.0, 0.0]), windows)
    assert got[0].tolist() == pytest.approx([1.0, 1.5, 1.75, 1.875])
    assert got[1].tolist() == [1.0, 2.0, 3.0, 4.0]  # beta = 1: every draft token
    assert got[2].tolist() == [1.0, 1.0, 1.0, 1.0]  # beta = 0: the bonus token only


def test_gain_argmax_by_hand_for_two_latency_settings():
    beta = torch.tensor([0.5])
    windows = torch.arange(1, 5)  # E = 1.5, 1.75, 1.875, 1.9375
    verify = torch.full((1, 4), 10.0)
    # Free drafting, constant verify: G only grows with k -> the deepest window.
    gain = window_gain(beta, windows, 0.0, verify)
    assert gain[0].tolist() == pytest.approx([0.15, 0.175, 0.1875, 0.19375])
    assert best_window(beta, windows, 0.0, verify).tolist() == [4]
    # 1 ms per draft step: 1.5/11, 1.75/12, 1.875/13, 1.9375/14 -> k = 2.
    gain = window_gain(beta, windows, 1.0, verify)
    assert gain[0].tolist() == pytest.approx([1.5 / 11, 1.75 / 12, 1.875 / 13, 1.9375 / 14])
    assert best_window(beta, windows, 1.0, verify).tolist() == [2]
    # Verify cost 10 + 4k, free drafting: 1.5/14 > 1.75/18 > ... -> k = 1.
    growing = (10.0 + 4.0 * windows.double()).unsqueeze(0)
    assert best_window(beta, windows, 0.0, growing).tolist() == [1]
    # beta = 0: every window gives 1 token for the same cost; the tie goes to the smallest.
    assert best_window(torch.tensor([0.0]), windows, 0.0, verify).tolist() == [1]


def test_fsm_and_cache_fsm_steps():
    assert fsm_step(3, accepted=1, used=3) == 2  # rejection
    assert fsm_step(3, accepted=3, used=3) == 4  # all accepted
    cache = {10, 11}
    assert cache_fsm_step(3, [11, 20], used=3, cache=cache) == 4  # hit, rejection
    assert cache_fsm_step(3, [20, 11, 21], used=3, cache=cache) == 5  # hit, all accepted
    assert cache_fsm_step(3, [20, 21, 22], used=3, cache=cache) == 3  # no hit, all accepted
    assert cache_fsm_step(3, [20], used=3, cache=cache) == 2  # no hit, rejection
    assert cache_fsm_step(3, [], used=3, cache=cache) == 2  # first token rejected
    assert cache_fsm_step(0, [], used=0, cache=cache) == 1  # window 0 is not absorbing


def test_tokens_per_window_count_the_beam_levels():
    # Width 2: level 1 {0, 1}, level 2 {2, 3} (best two of 2, 3, 4), level 3 {5, 6}.
    assert _tokens_upto(wide_tree(), 3, 2)[0].tolist() == [1, 3, 5, 7]
    assert _tokens_upto(wide_tree(), 2, 1)[0].tolist() == [1, 2, 3]


# --- the policy ----------------------------------------------------------------------------------


def test_mle_policy_starts_deep_then_follows_the_gain():
    policy = DropinPolicy(DropinConfig(variant=DropinVariant.MLE))
    cands = chain(4)
    # No evidence yet: the deepest window, as the configured EAGLE tree.
    assert policy.decide(iteration(cands, 4)).selection.counts.tolist() == [4]
    outcome(policy, 2)  # V = 1 of 4: beta = 1 / (1 + 1) = .5
    # No latency observed: a_q = 0 and constant b_p, so still the deepest window.
    assert policy.decide(iteration(cands, 4)).selection.counts.tolist() == [4]
    outcome(policy, 2)  # beta stays .5
    # 1 ms per draft step and a constant 10 ms verify pass: k = 2 (hand-computed above).
    policy.draft_step_ms = 1.0
    for tokens in (2, 3, 4, 5):
        policy.verify_latency.observe((tokens, 100), 10.0)
    decision = policy.decide(iteration(cands, 4))
    assert decision.selection.counts.tolist() == [2]
    assert (decision.depth, decision.budget) == (2, 3)


def test_mle_policy_uses_the_fitted_verify_model():
    policy = DropinPolicy()
    cands = chain(4)
    policy.decide(iteration(cands, 4))
    outcome(policy, 2)  # beta = .5
    for tokens in (1, 3, 5, 7):  # 10 ms + 4 ms per verified token
        policy.verify_latency.observe((tokens, 100), 10.0 + 4.0 * tokens)
    grid = torch.tensor([[2, 3, 4, 5]])
    expected = [policy.predict_verify_ms(t, 100) for t in grid[0].tolist()]
    assert policy._verify_ms(grid, 100)[0].tolist() == pytest.approx(expected)
    # b_p(k) ~ 10 + 4 (1 + k): 1.5/18 > 1.75/22 > 1.875/26 > 1.9375/30 -> k = 1.
    assert policy.decide(iteration(cands, 4)).selection.counts.tolist() == [1]


def test_fsm_policy_transitions_and_clipping():
    policy = DropinPolicy(DropinConfig(variant=DropinVariant.FSM, min_window=1))
    cands = chain(4)
    windows = []
    for accepted in (5, 2, 1, 1, 1, 2):  # V = 4 (all), 1, 0, 0, 0, 1 (all of window 1)
        windows.append(policy.decide(iteration(cands, 4)).selection.counts.item())
        outcome(policy, accepted)
    # 4 (start) -> 4 (clipped at max) -> 3 -> 2 -> 1 -> 1 (clipped at min) -> 2.
    assert windows == [4, 4, 3, 2, 1, 1]
    assert policy.window("r0") == 2


def test_full_acceptance_of_a_shallow_tree_is_not_a_rejection():
    # Window 4 but the tree is only 2 deep: accepting both nodes counts as all accepted.
    policy = DropinPolicy(DropinConfig(variant=DropinVariant.FSM, max_window=4))
    policy.decide(iteration(chain(2), 4))
    outcome(policy, 3)  # V = 2 of the 2 verified
    assert policy.window("r0") == 4  # +1, clipped, rather than -1


def test_windows_are_applied_as_tree_depth_per_request():
    policy = DropinPolicy(DropinConfig(variant=DropinVariant.FSM))
    cands = wide_tree()
    policy.decide(iteration(cands, 3, draft_width=2))
    outcome(policy, 1, 4)  # r0: V = 0 -> window 2; r1: V = 3 of 3 -> stays 3
    decision = policy.decide(iteration(cands, 3, draft_width=2))
    expected = torch.stack(
        [
            restrict_to_shape(cands, 2, 2).valid[0],
            restrict_to_shape(cands, 3, 2).valid[1],
        ]
    )
    assert torch.equal(decision.selection.mask, expected)
    assert decision.selection.counts.tolist() == [4, 6]
    assert (decision.depth, decision.width) == (3, 2)
    assert decision.budget == decision.selection.total_tokens == 12


def test_cache_fsm_follows_the_token_cache():
    policy = DropinPolicy(DropinConfig(variant=DropinVariant.CACHE_FSM))
    assert policy.needs_history and not DropinPolicy().needs_history
    cands = chain(4)
    tokens = [10, 11, 12]  # the prompt fills the cache
    steps = [
        # (accept length, tokens committed, window expected at the next decide)
        (1, [50], 3),  # V = 0: nothing accepted, nothing in the cache -> -1
        (3, [60, 61, 62], 2),  # V = 2: 60, 61 unseen, rejection -> -1
        (2, [61, 63], 3),  # V = 1: 61 was cached by the previous step -> +1
        (4, [10, 11, 12, 64], 4),  # V = 3 of 3: hit and all accepted -> +2, clipped at 4
    ]
    counts = policy.decide(iteration(cands, 4, history=(list(tokens),))).selection.counts
    assert counts.tolist() == [4]
    for accepted, committed, window in steps:
        outcome(policy, accepted)
        tokens += committed
        decision = policy.decide(iteration(cands, 4, history=(list(tokens),)))
        assert decision.selection.counts.tolist() == [window]


def test_cache_fsm_without_history_fails_loudly():
    policy = DropinPolicy(DropinConfig(variant=DropinVariant.CACHE_FSM))
    with pytest.raises(ValueError, match="history"):
        policy.decide(iteration(chain(3), 3))


def test_forget_drops_the_request_state():
    policy = DropinPolicy(DropinConfig(variant=DropinVariant.FSM))
    policy.decide(iteration(chain(4), 4))
    outcome(policy, 1)
    assert policy.window("r0") == 3
    policy.forget("r0")
    assert policy.window("r0") is None
    # Seen again, it starts afresh at the deepest window; unknown rids are ignored.
    assert policy.decide(iteration(chain(4), 4)).selection.counts.tolist() == [4]
    policy.observe_outcome(("gone",), torch.tensor([3]), torch.tensor([3]))


def test_max_window_is_capped_by_the_draft_depth():
    policy = DropinPolicy(DropinConfig(max_window=6))
    assert policy.window_range(4) == (1, 4)
    assert DropinPolicy(DropinConfig(max_window=2)).window_range(4) == (1, 2)
    with pytest.raises(ValueError, match="min_window"):
        DropinPolicy(DropinConfig(min_window=3)).window_range(2)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"history": 0},
        {"acc_max": 1.0},
        {"acc_max": 0.0},
        {"min_window": -1},
        {"min_window": 3, "max_window": 2},
        {"max_window": 0},
        {"latency_smoothing": 0.0},
    ],
)
def test_config_is_validated(kwargs):
    with pytest.raises(ValueError):
        DropinConfig(**kwargs)
    with pytest.raises(TypeError):
        DropinConfig(variant="mle")


def test_mle_verify_latency_counts_the_rest_of_the_batch():
    # Two chains of 4, both beta = .5 after one rejection; verify ~ 10 ms + 4 ms per token.
    policy = DropinPolicy()
    cands = chain(4, rows=2)
    policy.decide(iteration(cands, 4))
    outcome(policy, 2, 2)
    for tokens in (2, 4, 6, 8):
        policy.verify_latency.observe((tokens, 200), 10.0 + 4.0 * tokens)
    # Request r0 at k with r1 at its current window 4 (5 tokens): 6 + k tokens, b_p = 34 + 4k:
    # 1.5/38 < 1.75/42 > 1.875/46 > 1.9375/50 -> k = 2 (alone it would be k = 1); same for r1.
    assert policy.decide(iteration(cands, 4)).selection.counts.tolist() == [2, 2]


def test_draft_shape_is_one_step_deeper_than_the_deepest_window():
    policy = DropinPolicy(DropinConfig(variant=DropinVariant.FSM))
    assert policy.draft_shape(2, 4, 2) == (4, 2)  # no request yet: the configured search
    cands = wide_tree()
    policy.decide(iteration(cands, 3, draft_width=2))
    outcome(policy, 1, 1)  # both rejected at once: windows 3 -> 2
    assert policy.draft_shape(2, 4, 2) == (3, 2)
    policy.forget("r0")
    policy.forget("r1")
    assert policy.draft_shape(2, 4, 2) == (4, 2)
