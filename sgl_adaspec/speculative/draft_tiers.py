"""Draft tiers: the (depth, width) shapes of the draft's beam search that a server builds and
switches between, and the eager beam step that runs them.

SGLang's EAGLE draft is a beam search of width w (`--speculative-eagle-topk`) over d steps
(`--speculative-num-steps`) whose best N - 1 nodes (`--speculative-num-draft-tokens` N, root
included) are verified. A tier (d', w'), d' <= d, w' <= w, runs d' - 1 draft forwards of B * w'
rows and verifies N' = `tier_draft_tokens(d', w', N)` nodes per request; steps 0 is a plain
decode (the root only). The server builds a bounded set of tiers at start-up (`tier_shapes`)
and runs each iteration in the cheapest built tier that holds the policy's shape
(`covering_tier`). SGLang's per-step lists, in the layout of a width-w search:
- scores[0] [B, 1, w] and scores[i] [B, w, w] (i >= 1): path probability of node (beam k,
  child c) of step i; the flat node index over all steps is j = k for step 0 and
  w + (i-1) w^2 + k w + c for step i >= 1;
- tokens[0] [B, w], tokens[i] [B, w*w]: the nodes' draft tokens, same order;
- parents[0] [B, w+1] = [-1, 0, .., w-1] and parents[i] [B, w] (i >= 1): the flat index of the
  k-th beam kept at step i, the parent of step i+1's nodes (k, *).
"""

from __future__ import annotations

import torch

Shape = tuple[int, int]  # (depth, width) of the draft's beam search; depth 0 = no draft


def tier_draft_tokens(depth: int, width: int, num_draft_tokens: int) -> int:
    """Nodes a request verifies in tier (depth, width), root included: the tier's best nodes,
    at most the configured `num_draft_tokens`; steps 0 verifies the root only."""
    if depth == 0:
        return 1
    return min(num_draft_tokens, 1 + width + (depth - 1) * width * width)


def tier_widths(topk: int) -> list[int]:
    """Widths worth a tier: the powers of two below `topk`, and `topk`."""
    widths, w = [], 1
    while w < topk:
        widths.append(w)
        w *= 2
    return [*widths, topk]


def _tier_cost(shape: Shape, num_draft_tokens: int) -> tuple[int, int, int]:
    """Order of tiers from cheapest: draft rows per request, then verified nodes."""
    depth, width = shape
    return (max(depth - 1, 0) * width, tier_draft_tokens(depth, width, num_draft_tokens), depth)


def tier_shapes(
    steps: int,
    topk: int,
    num_draft_tokens: int,
    limit: int,
    widths: list[int] | None = None,
    plain: bool = True,
) -> tuple[Shape, ...]:
    """The tiers to build for a configured (steps, topk, N): the configured shape first, then at
    most `limit` others, cheapest first: steps 0 where `plain` (a plain decode that keeps the
    draft warm), then every depth at each of `widths` (default `tier_widths(topk)`: the widths
    a policy may ask for). A chain (width 1) deeper than N - 1 is left out: SGLang verifies a
    d-step chain as exactly d + 1 nodes."""
    configured = (steps, topk)
    widths = tier_widths(topk) if widths is None else [w for w in widths if 1 <= w <= topk]
    others = [(0, topk)] if plain else []
    others += [
        (depth, width)
        for width in widths
        for depth in range(1, steps + 1)
        if (depth, width) != configured and not (width == 1 and depth + 1 > num_draft_tokens)
    ]
    others.sort(key=lambda shape: (shape[0] > 0, _tier_cost(shape, num_draft_tokens)))
    return (configured, *others[: max(limit, 0)])


def covering_tier(shape: Shape, tiers: tuple[Shape, ...], num_draft_tokens: int) -> Shape | None:
    """The cheapest of `tiers` that drafts at least `shape` (its depth and width); for depth 0,
    the steps-0 tier. None when no tier holds it."""
    depth, width = shape
    if depth == 0:
        return next((tier for tier in tiers if tier[0] == 0), None)
    fits = [tier for tier in tiers if tier[0] >= depth and tier[1] >= width]
    return min(fits, key=lambda tier: _tier_cost(tier, num_draft_tokens), default=None)


def beam_step(
    step: int,
    topk_p: torch.Tensor,
    topk_index: torch.Tensor,
    hidden: torch.Tensor | None,
    scores: torch.Tensor | None,
    width: int,
):
    """One step of the beam search, eager (SGLang's `select_top_k_tokens`, which is
    torch.compile'd and would compile once per width while serving).
    step 0: topk_p / topk_index [B, w] from the draft extend, hidden [B, H];
    step i >= 1: topk_p / topk_index [B * w, w] (each beam's children), hidden [B * w, H],
    scores [B, w] the beams' path probabilities.
    Returns (input_ids [B * w] of the next draft forward, its hidden [B * w, H], the kept
    beams' scores [B, w], (step scores, step tokens, step parents) in the layout above)."""
    if step == 0:
        bsz = topk_p.shape[0]
        parents = torch.arange(-1, width, dtype=torch.long, device=topk_p.device)
        hidden = None if hidden is None else hidden.repeat_interleave(width, dim=0)
        info = (topk_p.unsqueeze(1), topk_index, parents.expand(bsz, -1))
        return topk_index.flatten(), hidden, topk_p, info
    expanded = scores.unsqueeze(2) * topk_p.view(-1, width, width)  # [B, w, w]
    kept_p, kept = torch.topk(expanded.flatten(1), width, dim=-1)  # [B, w] flat (beam, child)
    children = topk_index.view(-1, width * width)
    if hidden is not None and hidden.shape[0] > 0:
        offsets = torch.arange(0, hidden.shape[0], width, device=kept.device)
        hidden = hidden[(kept // width + offsets.unsqueeze(1)).flatten()]
    parents = kept + (width + (step - 1) * width * width)
    return torch.gather(children, 1, kept).flatten(), hidden, kept_p, (expanded, children, parents)
