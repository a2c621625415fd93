"""Draft tiers: a narrower, shallower beam search reported in the configured search's layout.

SGLang's EAGLE draft is a beam search of width w (`--speculative-eagle-topk`) over d steps
(`--speculative-num-steps`), recorded per step in three lists that everything after the draft
(`organize_draft_results`, the tree builder, the verify buffers) reads with w and d fixed:
- scores[0] [B, 1, w] and scores[i] [B, w, w] (i >= 1): path probability of node (beam k,
  child c) of step i; the flat node index over all steps is j = k for step 0 and
  w + (i-1) w^2 + k w + c for step i >= 1;
- tokens[0] [B, w], tokens[i] [B, w*w]: the nodes' draft tokens, same order;
- parents[0] [B, w+1] = [-1, 0, .., w-1] and parents[i] [B, w] (i >= 1): the flat index of the
  k-th beam kept at step i, the parent of step i+1's nodes (k, *).

A tier (d', w') with d' <= d, w' <= w runs only d' - 1 draft forwards of B * w' rows (instead
of d - 1 forwards of B * w rows). `embed_beam` writes its lists into the (d, w) layout and fills
every slot the small search did not produce with a padding node whose score, -(step + 1), is
below every real score (real scores are probabilities, >= 0) and below its own parent's. So the
top-(N - 1) pick of `organize_draft_results` takes real nodes first and stays closed under
parent; padding nodes it still takes (when the tier has fewer than N - 1 nodes) are recognised
by their negative score and never verified (`sglang.tree.candidates_from_verify_input`).
"""

from __future__ import annotations

import torch

PAD_TOKEN = 0


def pad_score(step: int) -> float:
    """Score of a padding node of draft step `step` (0-based): below every real node and below
    the padding nodes of earlier steps, so a padding node is never picked before its parent."""
    return -float(step + 1)


def _big_index(step: int, beam: torch.Tensor | int, child: torch.Tensor | int, width: int):
    """Flat node index of (beam, child) at `step` in a width-`width` layout."""
    if step == 0:
        return child
    return width + (step - 1) * width * width + beam * width + child


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


def embed_beam(
    scores: list[torch.Tensor],
    tokens: list[torch.Tensor],
    parents: list[torch.Tensor],
    width: int,
    steps: int,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """The per-step lists of a beam search of width w' and d' steps (SGLang's layout with w',
    see the module docstring) rewritten in the layout of width `width` >= w' and `steps` >= d'
    steps. Returns (scores, tokens, parents), `steps` entries each."""
    small_steps = len(scores)
    small_width = tokens[0].shape[1]
    if not (1 <= small_steps <= steps and 1 <= small_width <= width):
        raise ValueError(
            f"a tier of {small_steps} steps and width {small_width} does not fit the configured "
            f"{steps} steps and width {width}"
        )
    bsz = tokens[0].shape[0]
    device, score_dtype, token_dtype = tokens[0].device, scores[0].dtype, tokens[0].dtype
    parent_dtype = parents[0].dtype
    w1 = small_width
    out_scores, out_tokens, out_parents = [], [], []

    def small_to_big(step: int, flat: torch.Tensor) -> torch.Tensor:
        """Flat indices of step `step` nodes in the w' layout -> the same nodes' big indices."""
        if step == 0:
            return flat
        local = flat - (w1 + (step - 1) * w1 * w1)
        return _big_index(step, local // w1, local % w1, width)

    for step in range(steps):
        if step == 0:
            score = torch.full((bsz, 1, width), pad_score(0), dtype=score_dtype, device=device)
            token = torch.full((bsz, width), PAD_TOKEN, dtype=token_dtype, device=device)
            score[:, :, :w1] = scores[0]
            token[:, :w1] = tokens[0]
            parent = torch.arange(-1, width, dtype=parent_dtype, device=device).expand(bsz, -1)
        else:
            score = torch.full(
                (bsz, width, width), pad_score(step), dtype=score_dtype, device=device
            )
            token = torch.full((bsz, width, width), PAD_TOKEN, dtype=token_dtype, device=device)
            # Padding beam k continues from the padding node (k, 0) of this step.
            beams = torch.arange(width, dtype=parent_dtype, device=device)
            parent = _big_index(step, beams, 0, width).expand(bsz, -1).clone()
            if step < small_steps:
                score[:, :w1, :w1] = scores[step]
                token[:, :w1, :w1] = tokens[step].view(bsz, w1, w1)
                parent[:, :w1] = small_to_big(step, parents[step].to(parent_dtype))
            token = token.view(bsz, width * width)
        out_scores.append(score)
        out_tokens.append(token)
        out_parents.append(parent.contiguous())
    return out_scores, out_tokens, out_parents
