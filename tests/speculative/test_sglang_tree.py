"""SGLang's verify tree as the policy's Candidates (the adapter's pure part, on a fake input)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from sgl_adaspec.platform.cpu.ops import NO_NODE, sibling_links
from sgl_adaspec.speculative.sglang.tree import (
    candidates_from_verify_input,
    prune_tree,
    verify_tree_parents,
)


def test_nodes_below_an_unlinked_node_are_not_candidates():
    # Root 0; node 1 unlinked (no parent) with a child, node 2; node 3 a child of the root.
    parents = torch.tensor([[NO_NODE, NO_NODE, 1, 0]])
    verify_input = SimpleNamespace(
        retrieve_next_token=torch.zeros((1, 4), dtype=torch.long),
        draft_token=torch.tensor([5, 6, 7, 8]),
    )
    path_prob = torch.tensor([[0.4, 0.3, 0.5]])
    cands = candidates_from_verify_input(verify_input, path_prob, parents)
    assert cands.valid.tolist() == [[False, False, True]]
    assert cands.tokens.tolist() == [[6, 7, 8]]
    assert cands.path_prob[0, 2].item() == 0.5


def tree_input(parents: torch.Tensor) -> SimpleNamespace:
    """A fake verify input whose links are SGLang's for `parents` [bs, ntok]."""
    first_child, next_sibling = sibling_links(parents)
    return SimpleNamespace(retrieve_next_token=first_child, retrieve_next_sibling=next_sibling)


def test_pruning_with_every_node_kept_leaves_the_tree_as_it_was():
    # Under --tp N a follower rank prunes with an all-ones mask where rank 0 had no decision and
    # verified SGLang's tree unpruned: the two must be the same tree.
    parents = torch.tensor([[NO_NODE, 0, 0, 1, 1, 2], [NO_NODE, 0, 1, 2, 0, 4]])
    verify_input = tree_input(parents)
    before = (verify_input.retrieve_next_token.clone(), verify_input.retrieve_next_sibling.clone())
    prune_tree(verify_input, torch.ones(parents.shape, dtype=torch.bool), parents)
    assert torch.equal(verify_input.retrieve_next_token, before[0])
    assert torch.equal(verify_input.retrieve_next_sibling, before[1])
    assert torch.equal(verify_tree_parents(verify_input), parents)


def test_pruning_unlinks_the_nodes_not_kept():
    parents = torch.tensor([[NO_NODE, 0, 0, 1, 1, 2]])
    verify_input = tree_input(parents)
    keep = torch.tensor([[True, True, False, True, False, False]])
    prune_tree(verify_input, keep, parents)
    assert verify_tree_parents(verify_input).tolist() == [[NO_NODE, 0, NO_NODE, 1, NO_NODE, NO_NODE]]
