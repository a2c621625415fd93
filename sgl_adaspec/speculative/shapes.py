"""Shape primitives shared by the policies: narrowing candidate trees and turning masks into
selections. Pure tensor code; dims and terms as in `speculative/candidates.py`."""

from __future__ import annotations

import torch

from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.host_reads import free_to_read
from sgl_adaspec.speculative.selection import Selection


def restrict_to_shape(cands: Candidates, depth: int | torch.Tensor, width: int) -> Candidates:
    """The candidates a beam search of depth `depth` and width `width` would have kept: at each
    level the `width` nodes of highest f (ties: lower node index) among the children of the
    nodes kept one level up. `depth` is one int for the batch or [B] int64 per request (0 keeps
    nothing). width 1 keeps each request's most probable chain. Returns the same trees with
    `valid` narrowed [B, N]."""
    if isinstance(depth, int) and cands.beam is not None:
        drafted_depth, drafted_width = cands.beam
        if drafted_depth <= depth and drafted_width <= width:
            return cands  # drafted within the shape: the beam keeps every node
    if isinstance(depth, int) and free_to_read(cands.valid) and fits_shape(cands, depth, width):
        return cands  # the beam would keep every node: skip it where the check reads for free
    kept = beams_of_widths(cands, depth, (width,))[0]
    return cands.derived(valid=kept)  # a beam keeps every kept node's parent


def fits_shape(cands: Candidates, depth: int, width: int) -> bool:
    """Whether every request's valid nodes lie within `depth` levels, at most `width` per
    level: then the depth x width beam keeps them all (a valid node's parent is valid), as
    when the draft ran that very shape. Counting them is a few calls, where the beam search
    sorts once per level (~0.35 of adaserve's ~4 ms per speculative iteration on this host,
    simulator, h100-llama8b rate 48)."""
    if cands.num_nodes == 0:
        return True
    level = torch.where(cands.valid, cands.depth, 0)  # [B, N], 0 for padding
    if int(level.max()) > depth:
        return False
    per_level = torch.zeros(cands.num_requests, depth + 1, dtype=torch.int64, device=level.device)
    per_level.scatter_add_(1, level, cands.valid.long())
    return bool((per_level[:, 1:] <= width).all())


def beams_of_widths(
    cands: Candidates, depth: int | torch.Tensor, widths: tuple[int, ...]
) -> torch.Tensor:
    """`restrict_to_shape`'s `valid` for each of `widths` at once -> [len(widths), B, N] bool:
    one sort per level for all widths (a shape's gain is read at every width of a draft)."""
    node_depth = cands.depth  # [B, N], 1 = child of the root
    limit = depth if isinstance(depth, int) else depth.to(node_depth.device).unsqueeze(1)
    valid = cands.valid & (node_depth <= limit)
    max_level = depth if isinstance(depth, int) else int(depth.max()) if depth.numel() else 0
    beams = len(widths)
    kept = torch.zeros((beams, *valid.shape), dtype=torch.bool, device=valid.device)
    width = torch.tensor(widths).to(valid.device, non_blocking=True).view(-1, 1, 1)  # [W, 1, 1]
    index = torch.arange(cands.num_nodes, device=valid.device)
    has_parent = (cands.parents >= 0).expand_as(kept)
    parents = cands.parents.clamp(min=0).expand_as(kept)
    for level in range(1, max_level + 1):
        parent_kept = torch.where(has_parent, torch.gather(kept, 2, parents), True)
        at_level = valid & (node_depth == level) & parent_kept  # [W, B, N]
        if free_to_read(at_level) and not bool(at_level.any()):
            break  # nothing deeper: the rest of the loop would keep nothing
        key = torch.where(at_level, cands.path_prob, -1.0)
        # Stable descending sort: equal f keep node-index order.
        order = torch.sort(key, dim=2, descending=True, stable=True).indices
        rank = torch.empty_like(order).scatter_(2, order, index.expand_as(order))
        kept |= at_level & (rank < width)
    return kept


def draft_rows(depth: int | torch.Tensor, width: int | torch.Tensor, requests: int):
    """Tokens through the draft forwards of a depth x width beam for `requests` requests: the
    first step over each root, each later one over the n * w frontier."""
    return requests * (1 + (depth - 1) * width)


def selection_from_mask(mask: torch.Tensor, slo_mask: torch.Tensor | None = None) -> Selection:
    """A Selection of the nodes in `mask` [B, N] bool (closed under parent: the caller's
    duty); `slo_mask` marks the ones chosen for an SLO (default none)."""
    slo_counts = (
        torch.zeros(mask.shape[0], dtype=torch.int64, device=mask.device)
        if slo_mask is None
        else slo_mask.sum(dim=1)
    )
    return Selection(mask=mask, counts=mask.sum(dim=1), slo_counts=slo_counts)


def chain_positions(cands: Candidates) -> tuple[torch.Tensor, torch.Tensor]:
    """Each request's most probable chain (width-1 beam) as positions: node index [B, D] of the
    chain's node at depth 1..D (-1 past its end) and the conditional draft probability
    p = f(node) / f(parent) there [B, D] (0 past the end). D = deepest chain in the batch."""
    chain = restrict_to_shape(cands, int(cands.max_depth.max()) if cands.num_nodes else 0, 1)
    depth = torch.where(chain.valid, cands.depth, 0)  # [B, N]
    max_d = int(depth.max()) if depth.numel() else 0
    bsz = cands.num_requests
    nodes = torch.full((bsz, max_d + 1), -1, dtype=torch.int64, device=depth.device)
    index = torch.arange(cands.num_nodes, device=depth.device).expand_as(depth)
    # One chain node per depth: scatter node index into column depth (column 0 collects the rest).
    nodes.scatter_(1, depth, torch.where(chain.valid, index, -1))
    nodes = nodes[:, 1:]  # [B, D]
    f = torch.where(nodes >= 0, torch.gather(cands.path_prob, 1, nodes.clamp(min=0)), 0.0)
    parent_f = torch.cat([torch.ones_like(f[:, :1]), f[:, :-1]], dim=1)
    cond = torch.where(nodes >= 0, f / parent_f.clamp(min=1e-12), 0.0).clamp(0.0, 1.0)
    return nodes, cond


def chain_prefix_mask(
    cands: Candidates, nodes: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """[B, N] bool: the first lengths[r] nodes of each request's chain `nodes` [B, D]
    (as `chain_positions` returns it)."""
    depth_index = torch.arange(nodes.shape[1], device=nodes.device).unsqueeze(0)  # [1, D]
    take = (depth_index < lengths.unsqueeze(1)) & (nodes >= 0)  # [B, D]
    mask = torch.zeros(cands.tokens.shape, dtype=torch.bool, device=nodes.device)
    rows, cols = take.nonzero(as_tuple=True)
    mask[rows, nodes[rows, cols]] = True
    return mask
