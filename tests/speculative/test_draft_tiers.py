"""Draft tiers: a (d', w') beam search embedded in the configured (d, w) layout picks the same
tree SGLang would build from the small search, and never picks a padding node before a real one."""

from __future__ import annotations

import pytest
import torch

from sgl_adaspec.platform.cpu.ops import NO_NODE, tree_parents
from sgl_adaspec.speculative.draft_tiers import beam_step, embed_beam, pad_score
from sglang.srt.speculative.eagle_utils import organize_draft_results
from sglang.srt.speculative.spec_utils import select_top_k_tokens

VOCAB = 50


def beam_search(probs: torch.Tensor, width: int, steps: int):
    """SGLang's per-step lists for a beam search whose draft distribution at step i is probs[i]
    [B, V] for every beam (enough to exercise the layout)."""
    bsz = probs.shape[1]
    topk_p, topk_index = torch.topk(probs[0], width, dim=-1)
    scores, lists = None, ([], [], [])
    for i in range(steps):
        _ids, _hidden, scores, info = select_top_k_tokens(i, topk_p, topk_index, None, scores, width)
        for out, value in zip(lists, info):
            out.append(value)
        if i + 1 < steps:
            # Every beam proposes the same top-w children, scaled per beam to break ties.
            p, idx = torch.topk(probs[i + 1], width, dim=-1)
            scale = torch.linspace(1.0, 0.9, width).view(1, width, 1)
            topk_p = (p.unsqueeze(1) * scale).reshape(bsz * width, width)
            topk_index = idx.unsqueeze(1).expand(bsz, width, width).reshape(bsz * width, width).contiguous()
    return lists


def tree_of(score_list, token_list, parents_list, num_draft, width):
    """(token path of each selected node as tuples, selected scores) of SGLang's pick."""
    parent_list, index, tokens = organize_draft_results(
        score_list, token_list, parents_list, num_draft
    )
    parents = tree_parents(parent_list, index, width)  # [B, ntok], node 0 = root
    scores = torch.cat(score_list, dim=1).flatten(1).gather(1, index)
    paths = []
    for b in range(tokens.shape[0]):
        row = []
        for node in range(1, num_draft):
            path, cur = [], node
            while cur > 0:
                path.append(int(tokens[b, cur - 1]))
                cur = int(parents[b, cur])
            assert cur == 0, "a selected node's parent was not selected"
            row.append(tuple(reversed(path)))
        paths.append(row)
    return paths, scores, parents


def random_probs(steps: int, bsz: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.softmax(3 * torch.randn(steps, bsz, VOCAB, generator=gen), dim=-1)


@pytest.mark.parametrize("tier", [(1, 1), (1, 3), (2, 2), (3, 1), (2, 3), (4, 2)])
def test_tier_with_enough_nodes_picks_the_small_search_tree(tier):
    steps, width, num_draft = 4, 3, 5
    d, w = tier
    probs = random_probs(steps, 2, seed=d * 10 + w)
    small = beam_search(probs, w, d)
    real_nodes = w + (d - 1) * w * w
    big = embed_beam(*small, width=width, steps=steps)
    assert [s.shape for s in big[0]] == [(2, 1, 3)] + [(2, 3, 3)] * 3
    assert [t.shape for t in big[1]] == [(2, 3)] + [(2, 9)] * 3
    assert [p.shape for p in big[2]] == [(2, 4)] + [(2, 3)] * 3
    take = min(num_draft, real_nodes + 1)
    want, _, _ = tree_of(*small, take, w)
    got, scores, parents = tree_of(*big, num_draft, width)
    for b in range(2):
        real = [path for path, s in zip(got[b], scores[b]) if s >= 0]
        assert sorted(real) == sorted(want[b])
        # Whatever else was picked is padding, scored below zero, with its parent picked.
        assert int((scores[b] < 0).sum()) == num_draft - take
        assert bool((parents[b, 1:] != NO_NODE).all())


def test_full_tier_is_the_identity():
    probs = random_probs(3, 2, seed=7)
    lists = beam_search(probs, 2, 3)
    big = embed_beam(*lists, width=2, steps=3)
    for small_list, big_list in zip(lists, big):
        for a, b in zip(small_list, big_list):
            assert torch.equal(a.reshape(b.shape), b)


def test_padding_is_below_every_real_score_and_below_its_parent():
    assert pad_score(0) < 0
    assert all(pad_score(i + 1) < pad_score(i) for i in range(8))


def test_tier_larger_than_the_configuration_is_refused():
    lists = beam_search(random_probs(3, 1, seed=1), 3, 3)
    with pytest.raises(ValueError, match="does not fit"):
        embed_beam(*lists, width=2, steps=3)
    with pytest.raises(ValueError, match="does not fit"):
        embed_beam(*lists, width=3, steps=2)


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
