"""SGLang's verify tree as the policy's Candidates (the adapter's pure part, on a fake input):
tensor work only, so it runs between a GPU's draft and verify without a host read."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from sgl_adaspec.adapters.platform.cpu.tree_build import NO_NODE, sibling_links
from sgl_adaspec.adapters.platform.cpu.tree_verify import tree_parent_nodes
from sgl_adaspec.adapters.speculative.tree import (
    candidates_from_verify_input,
    draft_tree,
    prune_tree,
    verify_tree_parents,
)
from sgl_adaspec.speculative.host_reads import HostReadCounter


def tree_of(parents: torch.Tensor, path_prob: torch.Tensor | None = None, marked=False):
    """The plugin's view of a fake verify input whose links are SGLang's for `parents`, its
    positions each request's length plus the node's depth (an unlinked node's anything)."""
    bs, ntok = parents.shape
    first_child, next_sibling = sibling_links(parents)
    positions = torch.randint(0, 99, (bs, ntok))
    for b in range(bs):
        length = random.randint(1, 500)
        for node in range(ntok):
            depth, up = 0, node
            while up > 0:
                depth, up = depth + 1, parents[b, up].item()
            if up == 0:  # linked to the root
                positions[b, node] = length + depth
    verify_input = SimpleNamespace(
        retrieve_next_token=first_child,
        retrieve_next_sibling=next_sibling,
        draft_token=torch.arange(bs * ntok),
        positions=positions.view(-1),
    )
    if path_prob is None:
        path_prob = torch.rand(bs, ntok - 1)
    return draft_tree(verify_input, path_prob, marked=marked)


def random_parents(bs: int, ntok: int, unlinked: float) -> torch.Tensor:
    """[bs, ntok] SGLang-style parents (node 0 the root), some nodes unlinked."""
    rows = []
    for _ in range(bs):
        row = [NO_NODE]
        for j in range(1, ntok):
            row.append(NO_NODE if random.random() < unlinked else random.randint(0, j - 1))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.long)


def test_nodes_below_an_unlinked_node_are_not_candidates():
    # Root 0; node 1 unlinked (no parent) with a child, node 2; node 3 a child of the root.
    parents = torch.tensor([[NO_NODE, NO_NODE, 1, 0]])
    tree = tree_of(parents, torch.tensor([[0.4, 0.3, 0.5]]))
    cands = candidates_from_verify_input(tree, parents)
    assert cands.valid.tolist() == [[False, False, True]]
    assert cands.tokens.tolist() == [[1, 2, 3]]
    assert cands.path_prob[0, 2].item() == 0.5


@pytest.mark.parametrize("seed", range(3))
def test_parents_and_candidates_match_the_walk_over_the_links(seed):
    random.seed(seed)
    for bs, ntok in ((1, 2), (3, 8), (5, 17), (2, 64)):
        parents = random_parents(bs, ntok, unlinked=0.15)
        tree = tree_of(parents)
        links = (tree.next_token.tolist(), tree.next_sibling.tolist())
        found = verify_tree_parents(tree)
        assert found.tolist() == tree_parent_nodes(*links) == parents.tolist()
        cands = candidates_from_verify_input(tree, found)
        for b in range(bs):
            for node in range(ntok - 1):
                path, up = [], node + 1  # SGLang's index of candidate `node`
                while up > 0:
                    path.append(up)
                    up = parents[b, up].item()
                linked = up == 0
                assert cands.valid[b, node].item() == linked
                if linked:
                    want = min(tree.path_prob[b, n - 1].item() for n in path)
                    assert cands.path_prob[b, node].item() == pytest.approx(want)
                    assert cands.parents[b, node].item() == parents[b, node + 1].item() - 1
        walked = cands.__class__(cands.tokens, cands.parents, cands.path_prob, cands.valid)
        assert torch.equal(cands.depth, walked.depth)  # from positions: as walked


def test_the_window_reads_nothing_of_the_device_tensors():
    parents = random_parents(4, 16, unlinked=0.1)
    tree = tree_of(parents, marked=True)
    with HostReadCounter() as reads:
        found = verify_tree_parents(tree)
        cands = candidates_from_verify_input(tree, found)
        keep = torch.ones(parents.shape, dtype=torch.bool)
        keep[:, 1:] = cands.valid & (cands.path_prob > 0.3)
        prune_tree(tree, keep, found)
    assert reads.count == 0, reads.sites


def test_pruning_with_every_node_kept_leaves_the_tree_as_it_was():
    # Under --tp N a follower rank prunes with an all-ones mask where rank 0 had no decision and
    # verified SGLang's tree unpruned: the two must be the same tree.
    parents = torch.tensor([[NO_NODE, 0, 0, 1, 1, 2], [NO_NODE, 0, 1, 2, 0, 4]])
    tree = tree_of(parents)
    before = (tree.next_token.clone(), tree.next_sibling.clone())
    prune_tree(tree, torch.ones(parents.shape, dtype=torch.bool), parents)
    assert torch.equal(tree.next_token, before[0])
    assert torch.equal(tree.next_sibling, before[1])
    assert torch.equal(verify_tree_parents(tree), parents)


def test_pruning_unlinks_the_nodes_not_kept():
    parents = torch.tensor([[NO_NODE, 0, 0, 1, 1, 2]])
    tree = tree_of(parents)
    keep = torch.tensor([[True, True, False, True, False, False]])
    prune_tree(tree, keep, parents)
    assert verify_tree_parents(tree).tolist() == [[NO_NODE, 0, NO_NODE, 1, NO_NODE, NO_NODE]]
