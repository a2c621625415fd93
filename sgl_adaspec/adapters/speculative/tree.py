"""SGLang's verify tree in and out of the policy's tensors: its parent links, the policy's
`Candidates`, pruning to the decided nodes, and the ragged verify's rows scattered back."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from sgl_adaspec.adapters.platform.cpu.tree_build import NO_NODE, sibling_links
from sgl_adaspec.speculative.candidates import Candidates, path_min
from sgl_adaspec.speculative.host_reads import on_device


@dataclass(frozen=True)
class DraftTree:
    """SGLang's verify tree as the plugin reads it, between the draft and the verify: views of
    `EagleVerifyInput`'s tensors (pruning writes through them) and the draft's f.
    - draft_token [bs * ntok] int: each node's token, node 0 the root;
    - next_token / next_sibling [bs, ntok] int64: SGLang's first-child / next-sibling links;
    - path_prob [bs, ntok - 1] float: f of the nodes but the root;
    - positions [bs * ntok] int64: each node's position, its request's length plus its depth
      in the tree."""

    draft_token: torch.Tensor
    next_token: torch.Tensor
    next_sibling: torch.Tensor
    path_prob: torch.Tensor
    positions: torch.Tensor


def draft_tree(verify_input, path_prob: torch.Tensor, marked: bool = False) -> DraftTree:
    """The tree of SGLang's `verify_input`; `marked`: its tensors as device-resident
    (`host_reads.on_device`), for counting the host reads made of them."""
    mark = on_device if marked else (lambda tensor: tensor)
    return DraftTree(
        draft_token=mark(verify_input.draft_token),
        next_token=mark(verify_input.retrieve_next_token),
        next_sibling=mark(verify_input.retrieve_next_sibling),
        path_prob=mark(path_prob),
        positions=verify_input.positions,
    )


def verify_tree_parents(tree: DraftTree) -> torch.Tensor:
    """[bs, ntok] int64 on the tree's device: each node's parent in SGLang's verify tree (node
    0 = root), NO_NODE for the root and unlinked nodes. Tensor work only: a node's parent is
    that of the first sibling of its chain, found by pointer jumping over the sibling links."""
    bs, ntok = tree.next_token.shape
    nodes = torch.arange(ntok, device=tree.next_token.device).expand(bs, ntok)
    # Scatter through a spare last column, where unlinked entries land and are dropped.
    spare = torch.full((bs, ntok + 1), NO_NODE, dtype=torch.long, device=nodes.device)
    first_child = tree.next_token.long()
    parent_of_first = spare.clone().scatter_(
        1, torch.where(first_child >= 0, first_child, ntok), nodes
    )[:, :ntok]
    sibling = tree.next_sibling.long()
    previous = spare.clone().scatter_(1, torch.where(sibling >= 0, sibling, ntok), nodes)
    head = torch.where(previous[:, :ntok] >= 0, previous[:, :ntok], nodes)
    for _ in range(max(math.ceil(math.log2(max(ntok, 2))), 1)):
        head = torch.gather(head, 1, head)
    return torch.gather(parent_of_first, 1, head)


def candidates_from_verify_input(tree: DraftTree, parents: torch.Tensor) -> Candidates:
    """SGLang's verify tree (node 0 = root; `parents` from `verify_tree_parents`) as the policy's
    Candidates (root excluded), on the tree's device, tensor work only."""
    bs, ntok = tree.next_token.shape
    node_parents = parents[:, 1:] - 1  # root (0) -> -1; unlinked (NO_NODE) -> -2
    # A node is a candidate only if its whole path is linked.
    valid = path_min(node_parents >= -1, node_parents.clamp(min=-1))
    node_parents = torch.where(valid, node_parents, -1)
    # f never exceeds the parent's (Candidates checks it); enforce it against rounding.
    prob = path_min(tree.path_prob.float().clamp(0.0, 1.0), node_parents)
    depth = None
    if tree.positions.numel() == bs * ntok:
        # The nodes' depths from their positions, not a walk to the root per node (a policy
        # that narrows the tree to a shape reads them between the draft and the verify);
        # 1 for the others, as a walk over their parent links (-1) finds.
        at = tree.positions.view(bs, ntok).long()
        depth = torch.where(valid, at[:, 1:] - at[:, :1], 1)
    return Candidates.trusted(
        tokens=tree.draft_token.view(bs, ntok)[:, 1:].long(),
        parents=node_parents,
        path_prob=prob,
        valid=valid,
        depth=depth,
    )


def prune_tree(tree: DraftTree, keep: torch.Tensor, parents: torch.Tensor) -> None:
    """Unlink every node not in `keep` [bs, ntok] (closed under parent) from the verify tree
    whose parent links are `parents` (`verify_tree_parents`), on the tree's device. Keeping
    every node relinks the tree as it was (SGLang's links follow `sibling_links`' order)."""
    first_child, next_sib = sibling_links(torch.where(keep, parents, NO_NODE))
    tree.next_token.copy_(first_child)
    tree.next_sibling.copy_(next_sib)


def scatter_rows(logits_output, rows: torch.Tensor, num_rows: int) -> None:
    """Expand per-kept-node outputs back to SGLang's [bs * ntok] rows (the rest stay zero: the
    pruned tree never reads them)."""
    for name in ("next_token_logits", "hidden_states"):
        packed = getattr(logits_output, name, None)
        if packed is None:
            continue
        full = packed.new_zeros((num_rows, *packed.shape[1:]))
        full[rows] = packed
        setattr(logits_output, name, full)


def deepest_accepted(
    cands: Candidates, verified: torch.Tensor, committed_ids, accept_lens, ntok: int
) -> torch.Tensor | None:
    """[B] int64: each request's deepest accepted candidate node (-1: none), read off the verify
    pass's committed tokens (SGLang's `next_token_ids`, [bs * ntok]: request b's accepted draft
    tokens, then its bonus token, from b * ntok on) by walking the verified nodes `verified`
    [B, N] bool from the root. None when the tokens do not spell a verified path."""
    if committed_ids is None or accept_lens is None:
        return None
    ids = committed_ids.view(-1).tolist()
    lens = accept_lens.tolist()
    tokens, parents = cands.tokens.tolist(), cands.parents.tolist()
    verified = verified.tolist()
    deepest = []
    for b, accept_len in enumerate(lens):
        current = -1
        for token in ids[b * ntok : b * ntok + int(accept_len) - 1]:
            nxt = next(
                (
                    j for j, (t, p, v) in enumerate(zip(tokens[b], parents[b], verified[b]))
                    if v and p == current and t == token
                ),
                None,
            )  # fmt: skip
            if nxt is None:
                return None
            current = nxt
        deepest.append(current)
    return torch.tensor(deepest, dtype=torch.long)
