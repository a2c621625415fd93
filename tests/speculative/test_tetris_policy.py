"""The tetris policy: batch-wide top-C over the requests' draft chains, by hand-built trees."""

from __future__ import annotations


import pytest
import torch

from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.policies.base import IterationInput
from policy_inputs import iteration_input
from sgl_adaspec.speculative.policies.tetris import TetrisConfig, TetrisPolicy


def chains(*probs: list[float]) -> Candidates:
    """One chain per request: node j is the child of node j - 1, with path probability
    probs[r][j]; shorter chains are padded."""
    num_nodes = max(len(p) for p in probs)
    rows = len(probs)
    parents = torch.arange(-1, num_nodes - 1).repeat(rows, 1)
    prob = torch.zeros(rows, num_nodes)
    valid = torch.zeros(rows, num_nodes, dtype=torch.bool)
    for r, p in enumerate(probs):
        prob[r, : len(p)] = torch.tensor(p)
        valid[r, : len(p)] = True
    return Candidates(torch.arange(num_nodes).repeat(rows, 1), parents, prob, valid)


def iteration(cands: Candidates, draft_depth: int, draft_width: int = 1) -> IterationInput:
    return iteration_input(cands, draft_depth, draft_width)

def test_lengths_follow_the_global_top_c():
    # draft_depth 3, extra 1 -> k = 2, C = 2 * 2 = 4. Top-4 chain f: .9 .8 .7 (r0), .5 (r1).
    cands = chains([0.9, 0.8, 0.7], [0.5, 0.2, 0.1])
    decision = TetrisPolicy(TetrisConfig(extra=1)).decide(iteration(cands, draft_depth=3))
    assert decision.selection.counts.tolist() == [3, 1]
    assert decision.selection.mask.tolist() == [[True, True, True], [True, False, False]]
    assert (decision.depth, decision.width, decision.budget) == (3, 1, 2 + 4)
    assert decision.infeasible.tolist() == [False, False]


def test_flat_request_gives_its_share_to_a_confident_one():
    # Three requests, k = 2 each (C = 6). r1's chain is flat (f .1 from the first token on):
    # it verifies nothing but its root, and r0 / r2 take its two tokens, up to k + extra = 3.
    cands = chains([0.9, 0.85, 0.8], [0.1, 0.05, 0.01], [0.7, 0.6, 0.5])
    counts = TetrisPolicy().decide(iteration(cands, draft_depth=3)).selection.counts
    assert counts.tolist() == [3, 0, 3]
    # Standard SD would give each request k = 2: the same 6 tokens in total.
    assert int(counts.sum()) == 6


def test_only_the_most_probable_chain_is_a_candidate():
    # r0: root -> 0 (.9) -> 2 (.3); root -> 1 (.85) is a sibling, off the width-1 chain, though
    # its f beats everything r1 has. k = 1, extra 1, C = 2: r0's 0 and r1's 0 (.6 > .3).
    cands = Candidates(
        tokens=torch.arange(3).repeat(2, 1),
        parents=torch.tensor([[-1, -1, 0], [-1, 0, 1]]),
        path_prob=torch.tensor([[0.9, 0.85, 0.3], [0.6, 0.2, 0.1]]),
        valid=torch.ones(2, 3, dtype=torch.bool),
    )
    mask = TetrisPolicy().decide(iteration(cands, draft_depth=2, draft_width=2)).selection.mask
    assert mask.tolist() == [[True, False, False], [True, False, False]]


def test_selection_is_closed_and_within_capacity():
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        bsz, depth = 4, 5
        cond = torch.rand(bsz, depth, generator=gen)
        cands = chains(*cond.cumprod(dim=1).tolist())
        policy = TetrisPolicy(TetrisConfig(extra=2))
        decision = policy.decide(iteration(cands, draft_depth=depth))
        sel = decision.selection
        share = depth - 2
        assert int(sel.counts.sum()) == bsz * share  # chains are long enough to fill C
        assert bool((sel.counts <= share + 2).all()) and bool((sel.counts >= 0).all())
        # Closed under parent: on a chain, node j selected implies node j - 1 selected.
        assert bool((sel.mask[:, 1:] <= sel.mask[:, :-1]).all())
        assert decision.budget == bsz + bsz * share


def test_short_chains_leave_capacity_unused_rather_than_exceed_it():
    # k = 2 each (C = 4) but only 3 chain nodes exist in all: all verified, nothing more.
    cands = chains([0.9, 0.8], [0.5])
    sel = TetrisPolicy().decide(iteration(cands, draft_depth=3)).selection
    assert sel.counts.tolist() == [2, 1]


def test_below_turn_on_batch_size_each_request_verifies_its_share():
    cands = chains([0.9, 0.8, 0.7], [0.5, 0.2, 0.1])
    policy = TetrisPolicy(TetrisConfig(extra=1, turn_on_batch_size=3))
    decision = policy.decide(iteration(cands, draft_depth=3))
    assert decision.selection.counts.tolist() == [2, 2]
    assert (decision.depth, decision.budget) == (2, 2 + 4)
    # With a third request the batch reaches the threshold and selection is batch-wide.
    cands = chains([0.9, 0.8, 0.7], [0.5, 0.2, 0.1], [0.4, 0.3, 0.2])
    counts = policy.decide(iteration(cands, draft_depth=3)).selection.counts
    assert counts.tolist() == [3, 1, 2]  # top-6: .9 .8 .7 .5 .4 .3


def test_ties_are_broken_toward_the_earlier_request_and_shallower_node():
    # All f equal; C = 4: r0's whole chain (3) then r1's first node, every time.
    cands = chains([0.5, 0.5, 0.5], [0.5, 0.5, 0.5])
    policy = TetrisPolicy()
    first = policy.decide(iteration(cands, draft_depth=3)).selection
    again = policy.decide(iteration(cands, draft_depth=3)).selection
    assert first.counts.tolist() == [3, 1]
    assert torch.equal(first.mask, again.mask)


def test_extra_must_leave_capacity():
    cands = chains([0.9, 0.8])
    with pytest.raises(ValueError, match="--tetris-extra"):
        TetrisPolicy(TetrisConfig(extra=2)).decide(iteration(cands, draft_depth=2))


@pytest.mark.parametrize(
    "kwargs",
    [{"extra": -1}, {"turn_on_batch_size": 0}, {"latency_smoothing": 0.0}, {"baseline_tpot_ms": 0}],
)
def test_config_is_validated(kwargs):
    with pytest.raises(ValueError):
        TetrisConfig(**kwargs)


def test_config_feeds_the_shared_latency_state():
    policy = TetrisPolicy(TetrisConfig(latency_smoothing=0.5, baseline_tpot_ms=7.0))
    assert policy.latency_smoothing == 0.5
    assert policy.baseline_tpot_ms() == 7.0
