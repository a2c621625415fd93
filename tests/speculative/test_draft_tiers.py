"""Draft tiers: the tier set a server builds, the tier an iteration runs in, and the eager beam
step that runs a tier's draft (SGLang's, value for value)."""

from __future__ import annotations

import pytest
import torch

from sgl_adaspec.speculative.draft_tiers import (
    beam_step,
    covering_tier,
    tier_draft_tokens,
    tier_shapes,
    tier_widths,
)
from sglang.srt.speculative.spec_utils import select_top_k_tokens

VOCAB = 50


def test_tier_verifies_its_best_nodes_up_to_the_configured_count():
    assert tier_draft_tokens(0, 4, 8) == 1  # steps 0: the root
    assert tier_draft_tokens(3, 1, 8) == 4  # a chain: root + 3
    assert tier_draft_tokens(1, 2, 8) == 3  # root + 2 first-step nodes
    assert tier_draft_tokens(2, 2, 8) == 7  # root + 2 + 4
    assert tier_draft_tokens(3, 2, 8) == 8  # 11 drafted, 8 at most
    assert tier_draft_tokens(4, 4, 8) == 8


def test_tier_widths_are_powers_of_two_and_the_configured_width():
    assert tier_widths(1) == [1]
    assert tier_widths(4) == [1, 2, 4]
    assert tier_widths(6) == [1, 2, 4, 6]


def test_tier_set_is_the_configured_search_then_the_cheapest_tiers():
    shapes = tier_shapes(4, 4, 8, limit=16)
    assert shapes[0] == (4, 4)
    assert shapes[1] == (0, 4)  # steps 0 first
    assert len(shapes) == len(set(shapes)) == 1 + 12  # steps 0 + 4 depths x 3 widths - (4, 4)
    # Cheapest first: one-step tiers (no draft forward), then by draft rows per request.
    assert shapes[2:5] == ((1, 1), (1, 2), (1, 4))
    rows = [(d - 1) * w for d, w in shapes[2:]]
    assert rows == sorted(rows)
    assert tier_shapes(4, 4, 8, limit=3) == ((4, 4), (0, 4), (1, 1), (1, 2))
    assert tier_shapes(4, 4, 8, limit=0) == ((4, 4),)


def test_tier_set_follows_the_widths_a_policy_asks_for():
    # A chain policy (tetris) asks for width 1 only and never runs plain.
    assert tier_shapes(4, 2, 8, limit=16, widths=[1], plain=False) == (
        (4, 2), (1, 1), (2, 1), (3, 1), (4, 1),
    )  # fmt: skip
    # dropin keeps the configured width and varies the depth.
    assert tier_shapes(4, 2, 8, limit=16, widths=[2], plain=False) == (
        (4, 2), (1, 2), (2, 2), (3, 2),
    )  # fmt: skip


def test_chains_deeper_than_the_verify_budget_are_left_out():
    # SGLang verifies a d-step chain as d + 1 nodes: with 4 draft tokens, chains of 3 steps.
    shapes = tier_shapes(5, 2, 4, limit=99)
    assert (3, 1) in shapes
    assert (4, 1) not in shapes and (5, 1) not in shapes


def test_an_iteration_runs_in_the_cheapest_tier_that_holds_its_shape():
    tiers = tier_shapes(4, 4, 8, limit=16)
    assert covering_tier((2, 1), tiers, 8) == (2, 1)
    assert covering_tier((3, 3), tiers, 8) == (3, 4)  # no width-3 tier: the next width up
    assert covering_tier((4, 4), tiers, 8) == (4, 4)
    assert covering_tier((0, 1), tiers, 8) == (0, 4)
    # Without the tier it asks for, the configured search holds every shape.
    assert covering_tier((2, 2), ((4, 4), (1, 1)), 8) == (4, 4)
    assert covering_tier((0, 1), ((4, 4),), 8) is None
    assert covering_tier((5, 1), tiers, 8) is None


@pytest.mark.parametrize("width", [1, 2, 3])
def test_beam_step_matches_sglang(width):
    """The eager beam step is SGLang's select_top_k_tokens, value for value."""
    gen = torch.Generator().manual_seed(width)
    bsz, hid = 2, 5
    topk_p, topk_index = torch.topk(torch.rand(bsz, VOCAB, generator=gen), width, dim=-1)
    hidden = torch.randn(bsz, hid, generator=gen)
    ours_scores = theirs_scores = None
    ours_hidden = theirs_hidden = hidden
    ours_p = theirs_p = topk_p
    ours_i = theirs_i = topk_index
    for step in range(3):
        ours = beam_step(step, ours_p, ours_i, ours_hidden, ours_scores, width)
        theirs = select_top_k_tokens(step, theirs_p, theirs_i, theirs_hidden, theirs_scores, width)
        assert torch.equal(ours[0], theirs[0])
        assert torch.equal(ours[1], theirs[1])
        assert torch.equal(ours[2], theirs[2])
        for a, b in zip(ours[3], theirs[3]):
            assert torch.equal(a, b)
        ours_scores, theirs_scores = ours[2], theirs[2]
        ours_hidden, theirs_hidden = ours[1], theirs[1]
        probs = torch.softmax(torch.randn(bsz * width, VOCAB, generator=gen), dim=-1)
        ours_p, ours_i = torch.topk(probs, width, dim=-1)
        theirs_p, theirs_i = ours_p, ours_i


def test_chain_policies_draft_one_beam_and_tree_policies_keep_their_width():
    from sgl_adaspec.config import AdaspecConfig
    from sgl_adaspec.speculative.policies import build_policy

    def shape(name: str, **flags) -> tuple[int, int]:
        return build_policy(AdaspecConfig.of(spec_policy=name, **flags)).draft_shape(3, 5, 4)

    assert shape("adaspec") == (5, 1)
    assert shape("tetris") == (5, 1)
    assert shape("faser") == (5, 1)
    assert shape("faser", faser_lengths="1,3") == (3, 1)
    assert shape("faser", faser_lengths="2,9") == (5, 1)
    assert shape("dropin") == (5, 4)
