"""What the EAGLE draft's training extracts, fixed once so a resumed run extracts the same data.

The plan (``plan.json``): self-distillation batches (Spec-Bench training questions first, then
ShareGPT first turns; the target continues greedily with the chat template applied) and, every
third item, ShareGPT conversations through one forward pass. The held-out set: Spec-Bench
held-out questions with the fp32 target's greedy continuation (cached).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from sgl_adaspec.models.eagle_data import (
    Shard,
    Target,
    iter_sharegpt,
    sharegpt_json,
    spec_bench_split,
)

PLAN_VERSION = "eagle-plan/1"
EVAL_MAX_NEW = 128
GEN_MAX_NEW = 256
GEN_BATCH = 48
GEN_TOKEN_BUDGET = 16384  # prompts x (longest prompt + max new): bounds eager attention memory
FWD_BATCH = 16
FWD_MAX_TOKENS = 768
PROMPT_MAX_TOKENS = 384


def build_plan(work: Path, target: Target, sharegpt_items: int) -> list[dict]:
    """Work items, fixed once (plan.json) so that a resumed run extracts the same data."""
    path = work / "plan.json"
    if path.exists():
        plan = json.loads(path.read_text())
        if plan["version"] == PLAN_VERSION:
            return plan["items"]
    train_questions, _ = spec_bench_split()
    share = list(iter_sharegpt(sharegpt_json()))
    rng = random.Random(0)
    rng.shuffle(share)
    prompts: list[list[int]] = [
        target.chat_ids([{"role": "user", "content": q}]) for q in train_questions
    ]
    conversations: list[list[int]] = []
    half = len(share) // 2
    for conv in share[:half]:  # first turns as prompts
        if len(prompts) >= sharegpt_items * GEN_BATCH + len(train_questions):
            break
        if len(conv[0]["content"]) > 4 * PROMPT_MAX_TOKENS:
            continue
        ids = target.chat_ids(conv[:1])
        if len(ids) <= PROMPT_MAX_TOKENS:
            prompts.append(ids)
    for conv in share[half:]:  # whole conversations, forward only
        if len(conversations) >= sharegpt_items * FWD_BATCH:
            break
        ids = target.chat_ids(conv, generation_prompt=False)[:FWD_MAX_TOKENS]
        if len(ids) >= 64:
            conversations.append(ids)
    gen_items = []
    spec, rest = prompts[: len(train_questions)], prompts[len(train_questions) :]
    for source, group in (("spec_bench", spec), ("sharegpt", rest)):  # Spec-Bench first
        batches = length_batches(group)  # similar lengths together (left padding)
        rng.shuffle(batches)  # but short and long prompts mixed over time
        gen_items += [{"kind": "gen", "source": source, "seqs": b} for b in batches]
    fwd_items = [
        {"kind": "fwd", "source": "sharegpt", "seqs": conversations[i : i + FWD_BATCH]}
        for i in range(0, len(conversations), FWD_BATCH)
    ]
    items = []
    while gen_items or fwd_items:
        for _ in range(2):
            if gen_items:
                items.append(gen_items.pop(0))
        if fwd_items:
            items.append(fwd_items.pop(0))
    for i, item in enumerate(items):
        item["name"] = f"{i:05d}-{item['kind']}"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"version": PLAN_VERSION, "items": items}))
    tmp.replace(path)
    return items


def length_batches(prompts: list[list[int]]) -> list[list[list[int]]]:
    """Sorted by length, at most GEN_BATCH prompts and GEN_TOKEN_BUDGET padded tokens each."""
    batches, batch = [], []
    for p in sorted(prompts, key=len):
        if batch and (
            len(batch) == GEN_BATCH or (len(batch) + 1) * (len(p) + GEN_MAX_NEW) > GEN_TOKEN_BUDGET
        ):
            batches.append(batch)
            batch = []
        batch.append(p)
    if batch:
        batches.append(batch)
    return batches


def extract_item(target: Target, item: dict) -> Shard:
    if item["kind"] == "gen":
        seqs = target.generate(item["seqs"], GEN_MAX_NEW)
    else:
        hidden = target.forward_hidden(item["seqs"])
        seqs = [(s, h, 0) for s, h in zip(item["seqs"], hidden)]
    return Shard.build(seqs)


def build_eval_set(target_path: Path, out: Path, limit: int | None = None) -> Shard:
    """Held-out Spec-Bench questions with the fp32 target's greedy continuation (cached)."""
    if out.exists():
        return Shard.load(out)
    _, heldout = spec_bench_split()
    target = Target(target_path, torch.float32)
    prompts = [target.chat_ids([{"role": "user", "content": q}]) for q in heldout[:limit]]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    results: dict[int, tuple] = {}
    for i in range(0, len(order), 16):
        chunk = order[i : i + 16]
        for j, res in zip(chunk, target.generate([prompts[j] for j in chunk], EVAL_MAX_NEW)):
            results[j] = res
    shard = Shard.build([results[i] for i in range(len(prompts))], dtype=torch.float32)
    out.parent.mkdir(parents=True, exist_ok=True)
    shard.save(out, {"source": "spec_bench heldout", "max_new": EVAL_MAX_NEW})
    return shard
