"""SGLang's verify tree in and out of the policy's tensors: its parent links, the policy's
`Candidates`, pruning to the decided nodes, and the ragged verify's rows scattered back."""

from __future__ import annotations

import torch

from sgl_adaspec.platform.cpu.ops import NO_NODE, sibling_links, tree_parent_nodes
from sgl_adaspec.speculative.candidates import Candidates, cap_at_parents


def verify_tree_parents(verify_input) -> torch.Tensor:
    """[bs, ntok] int64 (CPU): each node's parent in SGLang's verify tree (node 0 = root),
    NO_NODE for roots and unlinked nodes."""
    links = (verify_input.retrieve_next_token.tolist(), verify_input.retrieve_next_sibling.tolist())
    return torch.tensor(tree_parent_nodes(*links), dtype=torch.long)


def candidates_from_verify_input(
    verify_input, path_prob: torch.Tensor, parents: torch.Tensor
) -> Candidates:
    """SGLang's verify tree (node 0 = root; `parents` from `verify_tree_parents`) as the policy's
    Candidates (root excluded)."""
    bs, ntok = verify_input.retrieve_next_token.shape
    draft_tokens = verify_input.draft_token.view(bs, ntok)
    node_parents = parents[:, 1:] - 1  # root (0) -> -1; unlinked (NO_NODE) -> -2
    # A node is a candidate only if its whole path is linked.
    valid = node_parents >= -1
    for _ in range(ntok - 1):
        parent_valid = torch.gather(valid, 1, node_parents.clamp(min=0))
        closed = valid & ((node_parents == -1) | parent_valid)
        if torch.equal(closed, valid):
            break
        valid = closed
    node_parents = torch.where(valid, node_parents, -1)
    prob = path_prob.float().cpu().clamp(0.0, 1.0)
    # f never exceeds the parent's (Candidates checks it); enforce it against rounding.
    prob = cap_at_parents(prob, node_parents)
    return Candidates(
        tokens=draft_tokens[:, 1:].long().cpu(),
        parents=node_parents,
        path_prob=prob,
        valid=valid,
    )


def prune_tree(verify_input, keep: torch.Tensor, parents: torch.Tensor) -> None:
    """Unlink every node not in `keep` [bs, ntok] (closed under parent) from the verify tree
    whose parent links are `parents` (`verify_tree_parents`). Keeping every node leaves the
    links as they are: relinking them took ~1 ms of a speculative iteration at 8 requests on
    a CPU, where a chain verified whole is the common case for a draft that reads well."""
    keep = keep.cpu()
    if bool(keep.all()):
        return
    next_token = verify_input.retrieve_next_token
    parents = torch.where(keep, parents, NO_NODE)
    first_child, next_sib = sibling_links(parents)
    verify_input.retrieve_next_token.copy_(first_child.to(next_token.device))
    verify_input.retrieve_next_sibling.copy_(next_sib.to(next_token.device))


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
