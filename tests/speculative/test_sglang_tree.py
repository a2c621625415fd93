"""SGLang's verify tree as the policy's Candidates (the adapter's pure part, on a fake input)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from sgl_adaspec.platform.cpu.ops import NO_NODE
from sgl_adaspec.speculative.sglang.tree import candidates_from_verify_input


def test_nodes_below_a_padding_node_are_not_candidates():
    # Root 0; node 1 a draft tier's padding node (negative score) with a child, node 2, that
    # scored >= 0; node 3 a real child of the root.
    parents = torch.tensor([[NO_NODE, 0, 1, 0]])
    verify_input = SimpleNamespace(
        retrieve_next_token=torch.zeros((1, 4), dtype=torch.long),
        draft_token=torch.tensor([5, 6, 7, 8]),
    )
    path_prob = torch.tensor([[-1.0, 0.3, 0.5]])
    cands = candidates_from_verify_input(verify_input, path_prob, parents)
    assert cands.valid.tolist() == [[False, False, True]]
    assert cands.tokens.tolist() == [[6, 7, 8]]
    assert cands.path_prob[0, 2].item() == 0.5
