"""SGLang's index kernels around the verify on CPU: a request's KV-cache slots (its
`req_to_token` row) gathered and assigned, the accepted slots and bonus tokens picked after the
verify, and the overlap schedule's read of the previous iteration's draft state."""

from __future__ import annotations

import torch

from sgl_adaspec.adapters.platform.cpu.tree_build import NO_NODE


def gather_token_slots(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    start: torch.Tensor,
    lengths: torch.Tensor,
) -> torch.Tensor:
    """Concatenate req_to_token[req_pool_indices[b], start[b] : start[b] + lengths[b]] over b."""
    rows, cols = token_slot_coords(req_pool_indices, start, lengths)
    return req_to_token[rows, cols]


def token_slot_coords(
    req_pool_indices: torch.Tensor, start: torch.Tensor, lengths: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, cols) into req_to_token of [start[b], start[b] + lengths[b]) for every b, packed."""
    lengths = lengths.long()
    total = int(lengths.sum())
    rows = torch.repeat_interleave(req_pool_indices.long(), lengths, output_size=total)
    first = torch.cumsum(lengths, 0) - lengths
    offset = torch.arange(total, device=lengths.device) - torch.repeat_interleave(
        first, lengths, output_size=total
    )
    cols = torch.repeat_interleave(start.long(), lengths, output_size=total) + offset
    return rows, cols


def assign_req_to_token_pool(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    batch_size: int,
) -> None:
    """Stands in for `allocation.assign_req_to_token_pool_func`: the inverse of
    `gather_token_slots`, writing the packed slots into each request's row (in place)."""
    rows, cols = token_slot_coords(
        req_pool_indices[:batch_size],
        start_offset[:batch_size],
        (end_offset - start_offset)[:batch_size],
    )
    req_to_token[rows, cols] = out_cache_loc[: rows.numel()].to(req_to_token.dtype)


def assign_draft_cache_locs_contiguous(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    topk: int,
    num_cols: int,
    positions: torch.Tensor | None = None,
    mrope: torch.Tensor | None = None,
) -> None:
    """Stands in for `cache_locs.assign_draft_cache_locs_contiguous_func` (in place)."""
    if mrope is not None:
        raise NotImplementedError("mrope draft positions are not supported on CPU")
    bs = seq_lens.shape[0]
    width = topk * num_cols
    lengths = torch.full((bs,), width, dtype=torch.long, device=seq_lens.device)
    out_cache_loc[: bs * width].copy_(
        gather_token_slots(req_to_token, req_pool_indices, seq_lens, lengths)
    )
    if positions is not None:
        positions[: bs * topk].copy_(seq_lens.long().repeat_interleave(topk))


def assign_extend_cache_locs(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    batch_size: int,
    draft_token_num: int,
    device,
) -> torch.Tensor:
    """Stands in for `cache_locs.assign_extend_cache_locs_func`; returns the int64 slots,
    sized batch_size * draft_token_num like the CUDA path (rows packed from the front)."""
    out = torch.empty((batch_size * draft_token_num,), dtype=torch.int64, device=device)
    lengths = (end_offset - start_offset)[:batch_size]
    slots = gather_token_slots(
        req_to_token, req_pool_indices[:batch_size], start_offset[:batch_size], lengths
    )
    out[: slots.numel()].copy_(slots)
    return out


def fill_front_out_cache_loc(
    num_front: torch.Tensor, out_cache_loc: torch.Tensor, front_out_cache_loc: torch.Tensor
) -> None:
    """Stands in for `cache_locs.fill_front_out_cache_loc_func` (in place)."""
    bs = num_front.numel()
    window = out_cache_loc.view(bs, -1)
    rows = torch.arange(bs, device=window.device)
    starts = torch.zeros_like(num_front)
    packed = gather_token_slots(window, rows, starts, num_front)
    front_out_cache_loc[: packed.numel()].copy_(packed)


def fill_bonus_tokens(
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    bonus_tokens: torch.Tensor,
    accept_stride: int,
    batch_size: int,
) -> None:
    """Stands in for `eagle.fill_bonus_tokens_func`: bonus[b] = accept_tokens at the last
    accepted slot of row b (accept_lens counts the bonus token)."""
    rows = torch.arange(batch_size, device=accept_lens.device)
    flat = rows * accept_stride + accept_lens[:batch_size].long() - 1
    bonus_tokens[:batch_size].copy_(accept_tokens.reshape(-1)[flat])


def fill_accept_out_cache_loc(
    accept_index: torch.Tensor,
    out_cache_loc: torch.Tensor,
    accept_out_cache_loc: torch.Tensor,
    size: int,
) -> None:
    """Stands in for `eagle.fill_accept_out_cache_loc_func`: pack out_cache_loc at every
    accepted (!= -1) entry of the flattened accept_index, in order."""
    flat = accept_index.reshape(-1)[:size]
    accepted = flat[flat != NO_NODE].long()
    accept_out_cache_loc[: accepted.numel()].copy_(out_cache_loc[accepted])


def gather_spec_extras(
    indices: torch.Tensor,
    topk_p_buf: torch.Tensor,
    topk_index_buf: torch.Tensor,
    output_tokens_buf: torch.Tensor,
    hidden_states_buf: torch.Tensor | None,
):
    """Stands in for `overlap_utils.gather_spec_extras` (the overlap schedule's read of the
    previous iteration's draft state): rows `indices` [M] of each buffer, as new tensors."""
    rows = indices.long()
    hidden = None if hidden_states_buf is None else hidden_states_buf[rows]
    return topk_p_buf[rows], topk_index_buf[rows], output_tokens_buf[rows], hidden
