"""SGLang's tree verification on CPU: greedy (`verify_tree_greedy`) and under sampling
(`tree_speculative_sampling_target_only`), each walking the tree that `tree_build` linked."""

from __future__ import annotations

import torch

from sgl_adaspec.adapters.platform.cpu.tree_build import NO_NODE


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
    bs = candidates.shape[0]
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


def tree_parent_nodes(
    next_token: list[list[int]], next_sibling: list[list[int]]
) -> list[list[int]]:
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
    bs = candidates.shape[0]
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
