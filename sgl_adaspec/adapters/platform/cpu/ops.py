"""Pure-torch versions of SGLang's speculative-decoding kernels that exist only for CUDA/Triton.

Each function has the signature and the in-place outputs of the SGLang function it stands in
for (named in its docstring), and computes exactly what that kernel computes, so SGLang's
callers cannot tell the difference. They run on any device; the hooks use them on CPU only.

Vocabulary (SGLang's): bs requests; each verifies `ntok` = num_draft_tokens tree nodes, node 0
being the root (the last committed, "bonus", token) and nodes 1..ntok-1 the draft tokens picked
from the draft's beam search; `topk` = beam width, `depth` = draft steps.
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
    bs, num_selected = selected_index.shape
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
    bs, ntok = parents.shape
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


def verify_tree_greedy(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Stands in for `spec_tree.verify_tree_greedy_func` (in place on the first three).

    Greedy tree acceptance: from the root, repeatedly move to the first child (in sibling order)
    whose draft token equals the target's argmax at the current node; stop when none matches.
    candidates / retrieve_* / target_predict [bs, ntok]; accept_index [bs, depth+1] (column 0 =
    root); accept_token_num [bs] = accepted draft tokens (the bonus token not counted);
    predicts [bs*ntok]: the target's token at every accepted node, the bonus at the last.

    The walk is inherently sequential per request (at most depth levels of at most ntok
    siblings), so it runs on host lists: a few microseconds for CPU-sized batches.
    """
    bs, ntok = candidates.shape
    max_accept = accept_index.shape[1]
    cand = candidates.tolist()
    r_index = retrieve_index.tolist()
    r_next = retrieve_next_token.tolist()
    r_sib = retrieve_next_sibling.tolist()
    target = target_predict.reshape(-1).tolist()
    accept_rows = accept_index.tolist()
    num_accepted = [0] * bs
    predict_updates: dict[int, int] = {}
    for b in range(bs):
        last = r_index[b][0]
        accept_rows[b][0] = last
        node = 0
        for j in range(1, max_accept):
            wanted = target[last]
            child = r_next[b][node]
            while child != NO_NODE and cand[b][child] != wanted:
                child = r_sib[b][child]
            if child == NO_NODE:
                break
            predict_updates[last] = wanted
            last = r_index[b][child]
            accept_rows[b][j] = last
            num_accepted[b] = j
            node = child
        predict_updates[last] = target[last]
    _write_walk(accept_index, accept_rows, accept_token_num, num_accepted)
    _write_predicts(predicts, predict_updates)


def _write_walk(accept_index, accept_rows, accept_token_num, num_accepted) -> None:
    accept_index.copy_(torch.tensor(accept_rows, dtype=accept_index.dtype))
    accept_token_num.copy_(torch.tensor(num_accepted, dtype=accept_token_num.dtype))


def _write_predicts(predicts: torch.Tensor, updates: dict[int, int]) -> None:
    """predicts[i] = token for every (i, token) of a tree walk."""
    if updates:
        where = torch.tensor(list(updates), dtype=torch.long, device=predicts.device)
        values = torch.tensor(list(updates.values()), dtype=predicts.dtype)
        predicts[where] = values.to(predicts.device)


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


def tree_parent_nodes(next_token: list[list[int]], next_sibling: list[list[int]]) -> list[list[int]]:
    """Parent node of every node from first-child / next-sibling links (NO_NODE if unlinked)."""
    parents = []
    for first_child, sibling in zip(next_token, next_sibling):
        row = [NO_NODE] * len(first_child)
        for node, child in enumerate(first_child):
            while child != NO_NODE:
                row[child] = node
                child = sibling[child]
        parents.append(row)
    return parents


def tree_speculative_sampling_target_only(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
) -> None:
    """Stands in for sgl-kernel's `tree_speculative_sampling_target_only` (keyword names kept).

    Tree verification under sampling that preserves the target distribution q. At each level the
    children of the last accepted node are tried in sibling order against one uniform coin u
    (drawn per accepted node): child c is accepted when u <= (sum of q over the children tried so
    far, c included) / threshold_acc, or when q(c) >= threshold_single. With both thresholds 1 a
    child is thus accepted with probability exactly q(c). When no child is accepted, the bonus
    token is sampled from q with the tried children's mass removed (their q is recorded in
    `draft_probs`, the residual is relu(q - draft_probs)), renormalised; after a full-depth
    accept it is sampled from q itself. Either way each committed token is distributed as q.

    candidates / retrive_* / uniform_samples [bs, ntok]; uniform_samples_for_final_sampling [bs];
    target_probs / draft_probs [bs, ntok, V] (draft_probs is scratch, zero on entry);
    accept_index [bs, depth+1]; accept_token_num [bs]; predicts [bs*ntok].
    """
    bs, ntok = candidates.shape
    max_depth = accept_index.shape[1]
    cand = candidates.tolist()
    r_index = retrive_index.tolist()
    r_next = retrive_next_token.tolist()
    r_sib = retrive_next_sibling.tolist()
    parents = tree_parent_nodes(r_next, r_sib)
    # q of every node's token under its parent's distribution, the only probabilities the walk reads.
    parent_rows = torch.tensor(parents, dtype=torch.long).clamp(min=0).to(target_probs.device)
    batch_rows = torch.arange(bs, device=target_probs.device).unsqueeze(1)
    tokens = candidates.long().clamp(0, target_probs.shape[2] - 1)  # the root's is never read
    node_prob = target_probs[batch_rows, parent_rows, tokens].tolist()
    coins = uniform_samples.tolist()
    accept_rows = accept_index.tolist()
    num_accepted = [0] * bs
    final_rows, last_nodes, rejected = [], [], []
    predict_updates: dict[int, int] = {}
    acc_scale = max(threshold_acc, 1e-9)
    for b in range(bs):
        last, node, coin = r_index[b][0], 0, coins[b][0]
        accept_rows[b][0] = last
        tried: list[int] = []
        for level in range(1, max_depth):
            child, mass, accepted = r_next[b][node], 0.0, False
            tried = []
            while child != NO_NODE:
                prob = node_prob[b][child]
                mass += prob
                if coin <= mass / acc_scale or prob >= threshold_single:
                    accepted = True
                    break
                tried.append(cand[b][child])
                child = r_sib[b][child]
            if not accepted:
                break
            predict_updates[last] = cand[b][child]
            last, node, coin = r_index[b][child], child, coins[b][child]
            accept_rows[b][level] = last
            num_accepted[b] = level
            tried = []
        final_rows.append(node)
        last_nodes.append(last)
        rejected.append(tried if num_accepted[b] < max_depth - 1 else [])
    _write_walk(accept_index, accept_rows, accept_token_num, num_accepted)

    rows = target_probs[torch.arange(bs, device=target_probs.device), torch.tensor(final_rows)]
    residual = rows.clone()  # [bs, V]
    for b, tokens in enumerate(rejected):
        if tokens:
            index = torch.tensor(tokens, dtype=torch.long, device=rows.device)
            draft_probs[b, final_rows[b], index] = rows[b, index]
            residual[b, index] = 0.0  # relu(q - draft_probs) with draft_probs = q there
    bonus = sample_from_unnormalized(residual, uniform_samples_for_final_sampling)
    for b in range(bs):
        predict_updates[last_nodes[b]] = int(bonus[b])
    _write_predicts(predicts, predict_updates)


def sample_from_unnormalized(weights: torch.Tensor, coins: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling per row: weights [bs, V] >= 0, coins [bs] in [0, 1).

    Returns [bs] int64: the first token whose cumulative weight exceeds coin * total (among
    tokens of positive weight), or the last positive-weight token when rounding leaves none."""
    cdf = torch.cumsum(weights, dim=1)
    target = coins.to(weights.dtype).view(-1, 1) * cdf[:, -1:]
    positive = weights > 0
    crossing = positive & (cdf > target)
    vocab = torch.arange(weights.shape[1], device=weights.device)
    first = torch.where(crossing, vocab, weights.shape[1]).min(dim=1).values
    last_positive = torch.where(positive, vocab, -1).max(dim=1).values
    return torch.where(first < weights.shape[1], first, last_positive.clamp(min=0))


def _per_row(value, batch_size: int, dtype: torch.dtype, device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        value = value.to(device=device, dtype=dtype).reshape(-1)
        return value.expand(batch_size) if value.numel() == 1 else value
    return torch.full((batch_size,), value, dtype=dtype, device=device)


def _renorm_at_pivots(probs: torch.Tensor, pivots: torch.Tensor) -> torch.Tensor:
    """Keep every probability >= its row's pivot (ties at the pivot included), renormalize."""
    kept = torch.where(probs >= pivots.unsqueeze(1), probs, 0.0)
    return kept / kept.sum(dim=1, keepdim=True)


def top_k_renorm_prob(probs: torch.Tensor, top_k) -> torch.Tensor:
    """Stands in for `sampling.renorm.top_k_renorm_prob` (FlashInfer semantics): probs [N, V]
    -> the k largest of each row (all ties at the k-th value kept), renormalized, float32."""
    probs = probs.float()
    batch_size, vocab_size = probs.shape
    top_ks = _per_row(top_k, batch_size, torch.int64, probs.device)
    ordered = torch.sort(probs, dim=1, descending=True).values
    cutoff = (top_ks - 1).clamp(min=0, max=vocab_size - 1)
    return _renorm_at_pivots(probs, ordered.gather(1, cutoff.unsqueeze(1)).squeeze(1))


def top_p_renorm_prob(probs: torch.Tensor, top_p) -> torch.Tensor:
    """Stands in for `sampling.renorm.top_p_renorm_prob` (FlashInfer semantics): drop the
    lowest-probability tokens whose total mass stays below 1 - p, keep ties at the pivot,
    renormalize. probs [N, V] -> float32 [N, V]."""
    probs = probs.float()
    batch_size, vocab_size = probs.shape
    top_ps = _per_row(top_p, batch_size, torch.float32, probs.device)
    ascending = torch.sort(probs, dim=1).values
    cdf = torch.cumsum(ascending, dim=1)
    cutoff = torch.searchsorted(cdf, (1.0 - top_ps).unsqueeze(1), right=False).squeeze(1)
    cutoff = cutoff.clamp(max=vocab_size - 1)
    return _renorm_at_pivots(probs, ascending.gather(1, cutoff.unsqueeze(1)).squeeze(1))
