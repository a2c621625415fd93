"""The EAGLE draft's training loss, the positions it scores, and the held-out top-1 agreement
measured through the same unrolled forward."""

from __future__ import annotations

import random

import torch
from torch.nn import functional as F

from sgl_adaspec.models.eagle_data import Shard
from sgl_adaspec.models.eagle_draft import EagleDraft

PROMPT_SAMPLE = 0.15  # share of prompt positions (predicting a prompt token) in the loss


def sequence_inputs(ids: torch.Tensor, hidden: torch.Tensor, embed: torch.Tensor):
    """Draft inputs for positions t = 0..L-2: (embed(ids[t+1]), hidden[t]); targets hidden[t+1]."""
    return embed[ids[1:]][None], hidden[:-1][None], torch.arange(len(ids) - 1), hidden[1:]


def draft_losses(
    model: EagleDraft,
    ids: torch.Tensor,
    hidden: torch.Tensor,
    embed: torch.Tensor,
    head: torch.Tensor,
    unroll: int,
    reg: float,
    select: torch.Tensor,
):
    """Loss summed over the selected positions and per-step top-1 (hits, counts) there.

    The draft layer runs over the whole sequence (cheap); the vocabulary projections, which
    dominate the cost, only at ``select`` (bool, one per draft position t = 0..L-2). Step s
    only scores positions t >= s-1 (earlier ones have no step-s history).
    """
    embeds, h_in, positions, h_next = sequence_inputs(ids, hidden, embed)
    outs = model.unrolled(embeds, h_in.to(embeds.dtype), positions, unroll)
    total = torch.zeros(())
    hits, counts = [], []
    rows = torch.nonzero(select).squeeze(1)  # step s scores the suffix rows[rows >= s-1]
    with torch.no_grad():  # the target distribution, once for all steps
        target_logits = (h_next[rows].to(head.dtype) @ head.T).float()
        target_probs = torch.softmax(target_logits, dim=-1)
        target_top = target_logits.argmax(-1)
        del target_logits
    for s, out in enumerate(outs, start=1):
        first = int((rows < s - 1).sum())  # rows is sorted
        if first == len(rows):
            hits.append(0)
            counts.append(0)
            continue
        r = rows[first:]
        o = out[0, r]
        logits = (o @ head.T).float()
        ce = -(target_probs[first:] * torch.log_softmax(logits, dim=-1)).sum(-1)
        sl1 = F.smooth_l1_loss(o.float(), h_next[r].float(), reduction="none").mean(-1)
        total = total + 0.8 ** (s - 1) * (ce + reg * sl1).sum()
        hits.append(int((logits.argmax(-1) == target_top[first:]).sum()))
        counts.append(len(r))
    return total, hits, counts


def generated_positions(n: int, start: int) -> torch.Tensor:
    """Draft positions t whose predicted token t+2 is a generated one after the first."""
    return torch.arange(n) >= max(start - 1, 0)


def training_selection(n: int, start: int, max_positions: int, rng: random.Random):
    """Every generated position, a PROMPT_SAMPLE share of prompt positions, at most max."""
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    chosen = generated_positions(n, start) | (torch.rand(n, generator=gen) < PROMPT_SAMPLE)
    rows = torch.nonzero(chosen).squeeze(1)
    if len(rows) > max_positions:
        keep = torch.randperm(len(rows), generator=gen)[:max_positions]
        chosen = torch.zeros(n, dtype=torch.bool)
        chosen[rows[keep]] = True
    return chosen


@torch.no_grad()
def evaluate(model: EagleDraft, shard: Shard, embed, head, unroll: int, autocast: bool) -> dict:
    """Held-out top-1 agreement per draft step (teacher-forced), generated tokens only."""
    model.eval()
    hits = [0] * unroll
    counts = [0] * unroll
    for i in range(len(shard)):
        ids, hidden, start = shard.sequence(i)
        select = generated_positions(len(ids) - 1, start)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            _, h, c = draft_losses(model, ids, hidden, embed, head, unroll, 0.0, select)
        for s in range(unroll):
            hits[s] += h[s]
            counts[s] += c[s]
    model.train()
    return {f"top1_step{s + 1}": hits[s] / max(counts[s], 1) for s in range(unroll)} | {
        "eval_positions": counts[0]
    }
