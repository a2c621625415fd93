"""SGLang's tree building on CPU: the parent of every draft node, the tree-attention mask, the
nodes' positions and the first-child / next-sibling links the verify walks.

Stands in for `spec_tree.build_tree_kernel_efficient_func`; the vocabulary is the package's
(`sgl_adaspec.adapters.platform.cpu`).
"""

from __future__ import annotations

import torch
from sglang.kernels.ops.speculative.spec_tree import TreeMaskMode

NO_NODE = -1


def tree_parents(
    parent_list: torch.Tensor, selected_index: torch.Tensor, topk: int
) -> torch.Tensor:
    """Parent node of every tree node.

    parent_list [bs, P]: for each beam-search expansion slot, the score-list index of the node it
    expanded (slot 0 = the root). selected_index [bs, ntok-1]: the score-list indices of the
    chosen draft nodes, ascending. Returns parents [bs, ntok] int64: parents[:, 0] = NO_NODE,
    parents[b, i] = node position of i's parent (0 = root), or NO_NODE if the parent was not
    selected (the CUDA kernel then leaves i unlinked; with EAGLE's monotone scores it never is).
    """
    bs = selected_index.shape[0]
    device = selected_index.device
    slot = selected_index // topk  # [bs, ntok-1] expansion slot of each node's parent
    if parent_list.shape[1] == 0:
        # A one-step draft: every node is a child of the root (the kernel never reads the list).
        parent_list = torch.zeros((bs, 1), dtype=torch.long, device=device)
    parent_score_index = torch.gather(parent_list, 1, slot.clamp(max=parent_list.shape[1] - 1))
    # [bs, ntok-1, ntok-1]: does selected node j hold node i's parent?
    match = selected_index.unsqueeze(1) == parent_score_index.unsqueeze(2)
    found = match.any(dim=2)
    first_match = match.int().argmax(dim=2) + 1
    parents = torch.where(slot == 0, 0, torch.where(found, first_match, NO_NODE))
    root = torch.full((bs, 1), NO_NODE, dtype=torch.long, device=device)
    return torch.cat([root, parents.long()], dim=1)


def ancestor_mask(parents: torch.Tensor, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tree-attention mask and node depths from parent pointers.

    parents [bs, ntok] (see `tree_parents`). Returns (mask [bs, ntok, ntok] bool: node i may
    attend to node j iff j is the root, i itself, or an ancestor of i within `depth` hops;
    node_depth [bs, ntok] int64: number of draft nodes on the path root..i, as the kernel counts).
    """
    bs, ntok = parents.shape
    device = parents.device
    eye = torch.eye(ntok, dtype=torch.bool, device=device).expand(bs, ntok, ntok)
    mask = eye.clone()
    mask[:, :, 0] = True
    node_depth = torch.zeros((bs, ntok), dtype=torch.long, device=device)
    node_depth[:, 1:] = 1
    # Walk up one hop per iteration; `cur` is the ancestor reached so far (NO_NODE when done).
    cur = parents.clone()
    cur[:, 0] = NO_NODE
    rows = torch.arange(ntok, device=device).expand(bs, ntok)
    for _ in range(depth - 1):
        live = cur > 0
        if not bool(live.any()):
            break
        batch_idx, node_idx = live.nonzero(as_tuple=True)
        mask[batch_idx, node_idx, cur[batch_idx, node_idx]] = True
        node_depth += live.long()
        cur = torch.where(live, torch.gather(parents, 1, cur.clamp(min=0)), NO_NODE)
    del rows
    return mask, node_depth


def sibling_links(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """First-child / next-sibling links (SGLang's retrieve_next_token / retrieve_next_sibling).

    The CUDA kernel links children from the highest node index down, so a parent's first child
    is its lowest-index child and each sibling points to the next higher-index sibling.
    """
    ntok = parents.shape[1]
    idx = torch.arange(ntok, device=parents.device)
    linked = parents >= 0  # [bs, ntok]
    # child_of[b, p, i]: node i is a linked child of node p
    child_of = linked.unsqueeze(1) & (parents.unsqueeze(1) == idx.view(1, ntok, 1))
    big = ntok
    first_child = torch.where(child_of, idx.view(1, 1, ntok), big).min(dim=2).values
    next_token = torch.where(first_child < big, first_child, NO_NODE)
    # same_parent_after[b, i, j]: j > i and j has i's parent
    same_parent_after = (
        linked.unsqueeze(2)
        & linked.unsqueeze(1)
        & (parents.unsqueeze(2) == parents.unsqueeze(1))
        & (idx.view(1, 1, ntok) > idx.view(1, ntok, 1))
    )
    next_sib = torch.where(same_parent_after, idx.view(1, 1, ntok), big).min(dim=2).values
    next_sibling = torch.where(next_sib < big, next_sib, NO_NODE)
    return next_token, next_sibling


def build_tree_kernel_efficient(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """Stands in for `spec_tree.build_tree_kernel_efficient_func` (writes its outputs in place).

    tree_mask: FULL_MASK = per request a [ntok, seq_len + ntok] row-major block (prefix columns
    left as the caller filled them); QLEN_ONLY = per request [ntok, ntok]. positions [bs*ntok];
    retrieve_* [bs, ntok].
    """
    if tree_mask_mode == TreeMaskMode.QLEN_ONLY_BITPACKING:
        raise NotImplementedError("QLEN_ONLY_BITPACKING tree masks are not supported on CPU")
    bs, ntok = verified_seq_len.shape[0], draft_token_num
    device = verified_seq_len.device
    seq_lens = verified_seq_len.long()
    if selected_index.shape[1] == 0:
        parents = torch.full((bs, 1), NO_NODE, dtype=torch.long, device=device)
    else:
        parents = tree_parents(parent_list.long(), selected_index.long(), topk)
    mask, node_depth = ancestor_mask(parents, depth)
    next_token, next_sibling = sibling_links(parents)

    retrieve_index.copy_(torch.arange(bs * ntok, device=device).view(bs, ntok))
    retrieve_next_token.copy_(next_token)
    retrieve_next_sibling.copy_(next_sibling)
    positions.copy_((seq_lens.unsqueeze(1) + node_depth).view(-1))

    if tree_mask_mode == TreeMaskMode.QLEN_ONLY:
        tree_mask[: bs * ntok * ntok].copy_(mask.reshape(-1))
        return
    # FULL_MASK: request b's block starts after the blocks of requests < b.
    block_start = ntok * (torch.cumsum(seq_lens, 0) - seq_lens) + ntok * ntok * torch.arange(
        bs, device=device
    )
    row_len = seq_lens + ntok
    for b in range(bs):  # one strided copy per request
        start, length, prefix = int(block_start[b]), int(row_len[b]), int(seq_lens[b])
        block = tree_mask[start : start + ntok * length].view(ntok, length)
        block[:, prefix:].copy_(mask[b])
