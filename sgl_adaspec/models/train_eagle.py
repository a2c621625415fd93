"""Train the EAGLE draft for SmolLM2-135M-Instruct on CPU, resumably, in bounded memory.

    python -m sgl_adaspec.models.train_eagle --minutes 120 [--work-dir DIR] [--export DIR]

One process (one thread) alternates between extracting target features into shards and
training on them, so the learning curve starts early and data keeps growing up to
``--max-tokens``:

* extraction: work items from a fixed plan (``plan.json``, written once): self-distillation
  batches (Spec-Bench training questions first, then ShareGPT first turns; the target continues
  greedily with the chat template applied) and, every third item, ShareGPT conversations through
  one forward pass. See ``eagle_data``. A shard per item; an item is done when its file exists.
* training: a step = sequences sampled uniformly from all shards (a small LRU of loaded shards
  bounds RAM) until ``--tokens-per-step`` tokens; loss per draft step s = 1..``--unroll`` (SGLang's
  draft tree: step s > 1 feeds the draft its own previous hidden state) = soft cross-entropy to
  the target's distribution softmax(W h[t+1]) + ``--reg`` * SmoothL1(draft hidden, h[t+1]).
  New data is extracted whenever trained tokens exceed ``--reuse`` x extracted tokens.

Every ``--eval-every`` steps: held-out top-1 agreement (Spec-Bench held-out questions, the fp32
target's greedy continuation, teacher-forced), a line in ``curve.jsonl``, a checkpoint
(``ckpt.pt``, written atomically), and, when held-out top-1 improved, an export to ``--export``
(config.json + bf16 safetensors in SGLang's layout, learning curve copied alongside).
``--minutes`` bounds the run; rerunning the same command resumes from ``ckpt.pt``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import time
from collections import OrderedDict
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch.nn import functional as F
from tqdm import tqdm

from sgl_adaspec.models.eagle_data import (
    Shard,
    Target,
    iter_sharegpt,
    sharegpt_json,
    spec_bench_split,
)
from sgl_adaspec.models.eagle_draft import WEIGHTS_FILE, DraftShape, EagleDraft, export_draft
from sgl_adaspec.models.smollm2 import prepare_smollm2
from sgl_adaspec.models.tiny import default_cache_dir
from sgl_adaspec.data import SMOLLM2_EAGLE_DRAFT

DEFAULT_EXPORT = SMOLLM2_EAGLE_DRAFT
PLAN_VERSION = "eagle-plan/1"
EVAL_MAX_NEW = 128
GEN_MAX_NEW = 256
GEN_BATCH = 48
GEN_TOKEN_BUDGET = 16384  # prompts x (longest prompt + max new): bounds eager attention memory
FWD_BATCH = 16
FWD_MAX_TOKENS = 768
PROMPT_MAX_TOKENS = 384
PROMPT_SAMPLE = 0.15  # share of prompt positions (predicting a prompt token) in the loss


def default_work_dir() -> Path:
    return default_cache_dir().parent / "eagle-smollm2"


def log(msg: str) -> None:
    tqdm.write(f"{time.strftime('%H:%M:%S')} {msg}", file=sys.stdout)  # above a running bar


# --------------------------------------------------------------------------- the plan


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


# --------------------------------------------------------------------------- losses


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
    n = len(positions)
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


# --------------------------------------------------------------------------- training state


def init_draft(shape: DraftShape, seed: int = 0) -> EagleDraft:
    torch.manual_seed(seed)
    model = EagleDraft(shape)
    h = shape.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.02)
        model.fc.bias.zero_()
        # Start by passing the target hidden state through (second half of fc's input).
        model.fc.weight[:, h:] += torch.eye(h)
        model.o_proj.weight.mul_(0.1)
        model.down_proj.weight.mul_(0.1)
    return model


class ShardPool:
    """Shards sampled by how little they have been used, at most ``cache`` of them in memory.

    A shard's weight is tokens / (1 + epochs)^2, epochs = its sampled tokens / its tokens, so
    fresh shards are preferred without training on one shard alone; uniform sampling over
    shards instead replays the first shards for many epochs and the draft memorises them
    (measured: top-1 0.48 on an early training shard vs 0.19 on a fresh one and 0.14 held out).
    ``uses`` (shard name -> sampled tokens) is part of the checkpoint.
    """

    def __init__(self, folder: Path, uses: dict[str, float], cache: int = 6):
        self.folder = folder
        self.cache: OrderedDict[str, Shard] = OrderedDict()
        self.size = cache
        self.uses = uses
        self.tokens: dict[str, int] = {}
        self.refresh()

    def refresh(self) -> None:
        self.names = sorted(p.name for p in self.folder.glob("*.safetensors"))
        for name in self.names:
            if name not in self.tokens:
                with safe_open(str(self.folder / name), framework="pt") as f:
                    self.tokens[name] = int(f.get_tensor("offsets")[-1])
            self.uses.setdefault(name, 0.0)

    def get(self, name: str) -> Shard:
        if name in self.cache:
            self.cache.move_to_end(name)
            return self.cache[name]
        shard = Shard.load(self.folder / name)
        self.cache[name] = shard
        if len(self.cache) > self.size:
            self.cache.popitem(last=False)
        return shard

    def weights(self) -> list[float]:
        return [
            self.tokens[n] / (1.0 + self.uses[n] / max(self.tokens[n], 1)) ** 2
            for n in self.names
        ]

    def sample(self, rng: random.Random):
        name = rng.choices(self.names, weights=self.weights())[0]
        shard = self.get(name)
        ids, hidden, start = shard.sequence(rng.randrange(len(shard)))
        self.uses[name] += len(ids)
        return ids, hidden, start


def estimated_uses(names: list[str], tokens_seen: float) -> dict[str, float]:
    """Uses of shards trained on by uniform sampling (checkpoints before ``uses`` existed):
    with shards arriving at even intervals, shard k of N got (S/N)(H_N - H_k) of S tokens."""
    n = len(names)
    harmonic = [0.0]
    for j in range(1, n + 1):
        harmonic.append(harmonic[-1] + 1.0 / j)
    return {name: tokens_seen / n * (harmonic[n] - harmonic[k]) for k, name in enumerate(names)}


def lr_at(step: int, args) -> float:
    warm = min(1.0, (step + 1) / args.warmup)
    progress = min(step / max(args.total_steps, 1), 1.0)
    return args.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def save_checkpoint(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def export(model: EagleDraft, target: Target, folder: Path, record: dict, curve: Path) -> None:
    export_draft(model, target.config, folder, extra={"step": record["step"]})
    shutil.copyfile(curve, folder / "learning_curve.jsonl")
    (folder / "training_summary.json").write_text(json.dumps(record, indent=2) + "\n")


# --------------------------------------------------------------------------- main loop


def run(args) -> int:
    torch.set_num_threads(args.threads)
    deadline = time.monotonic() + args.minutes * 60
    work: Path = args.work_dir
    (work / "shards").mkdir(parents=True, exist_ok=True)
    target_path = prepare_smollm2()
    target = Target(target_path, torch.bfloat16)
    embed, head = target.embed.detach(), target.lm_head.detach()
    shape = DraftShape.from_config(target.config)

    log("eval set ...")
    eval_shard = build_eval_set(target_path, work / "eval" / "heldout.safetensors")
    log(f"eval set: {len(eval_shard)} sequences, {eval_shard.tokens} tokens")
    log("plan ...")
    plan = build_plan(work, target, args.sharegpt_items)
    log(f"plan: {len(plan)} items")

    model = init_draft(shape)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    ckpt_path = work / "ckpt.pt"
    state = {"step": 0, "tokens_seen": 0, "train_seconds": 0.0, "extract_seconds": 0.0,
             "extracted_tokens": 0, "best_top1": -1.0, "rng": random.Random(1).getstate()}  # fmt: skip
    if ckpt_path.exists():
        ckpt = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        state = ckpt["state"]
        log(f"resumed at step {state['step']} ({state['tokens_seen']} tokens seen)")
    elif args.export and (args.export / WEIGHTS_FILE).exists():
        # A fresh machine: continue from the committed draft (weights only; the optimizer
        # restarts, the step count and curve carry on from its training summary).
        model.load_checkpoint_state(load_file(str(args.export / WEIGHTS_FILE)))
        summary = args.export / "training_summary.json"
        if summary.exists():
            done = json.loads(summary.read_text())
            state.update(step=done["step"], tokens_seen=done["tokens_seen"],
                         best_top1=done["top1_step1"])  # fmt: skip
            if (args.export / "learning_curve.jsonl").exists() and not (work / "curve.jsonl").exists():
                shutil.copyfile(args.export / "learning_curve.jsonl", work / "curve.jsonl")
        log(f"warm start from {args.export} at step {state['step']}")
    rng = random.Random()
    rng.setstate(state["rng"])
    curve = work / "curve.jsonl"
    shards = work / "shards"
    if "uses" not in state:
        names = sorted(p.name for p in shards.glob("*.safetensors"))
        state["uses"] = estimated_uses(names, state["tokens_seen"]) if names else {}
    pool = ShardPool(shards, state["uses"])
    extracted = {p.stem for p in shards.glob("*.safetensors")}
    state["extracted_tokens"] = sum(
        int(Shard.load(shards / f"{n}.safetensors").offsets[-1]) for n in sorted(extracted)
    ) if extracted else 0  # fmt: skip

    def next_item():
        for item in plan:
            if item["name"] not in extracted:
                return item
        return None

    def checkpoint(evaluate_now: bool) -> None:
        state["rng"] = rng.getstate()
        if evaluate_now:
            t0 = time.monotonic()
            metrics = evaluate(model, eval_shard, embed, head, args.unroll, autocast=True)
            record = {
                "step": state["step"], "tokens_seen": state["tokens_seen"],
                "extracted_tokens": state["extracted_tokens"],
                "train_hours": round(state["train_seconds"] / 3600, 3),
                "extract_hours": round(state["extract_seconds"] / 3600, 3),
                "train_loss": state.get("recent_loss"), "train_top1": state.get("recent_top1"),
                **{k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()},
                "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            }  # fmt: skip
            with open(curve, "a") as f:
                f.write(json.dumps(record) + "\n")
            log(f"eval ({time.monotonic() - t0:.0f}s): {json.dumps(record)}")
            if metrics["top1_step1"] > state["best_top1"] and args.export:
                state["best_top1"] = metrics["top1_step1"]
                export(model, target, args.export, record, curve)
                log(f"exported to {args.export}")
            elif args.export and (args.export / "learning_curve.jsonl").exists():
                shutil.copyfile(curve, args.export / "learning_curve.jsonl")
        save_checkpoint(ckpt_path, {"model": model.state_dict(), "opt": opt.state_dict(),
                                    "state": state})  # fmt: skip

    if state["step"] == 0 and not curve.exists():
        checkpoint(evaluate_now=True)  # the untrained baseline opens the curve

    last_ckpt = time.monotonic()
    loss_sum = weight_sum = 0.0
    hit_sum = count_sum = 0
    # The run's time budget as a bar on a terminal (stderr); nothing where stderr is not one.
    budget_s = round(deadline - time.monotonic())
    bar = tqdm(total=budget_s, desc="draft training", unit="s", file=sys.stderr, disable=None)
    while time.monotonic() < deadline:
        bar.n = min(budget_s, round(budget_s - (deadline - time.monotonic())))
        bar.set_postfix(step=state["step"], loss=state.get("recent_loss"), refresh=True)
        item = next_item()
        need_data = state["extracted_tokens"] < args.max_tokens and item is not None and (
            state["tokens_seen"] >= args.reuse * state["extracted_tokens"] or not pool.names
        )
        if need_data:
            t0 = time.monotonic()
            shard = extract_item(target, item)
            shard.save(shards / f"{item['name']}.safetensors", {"kind": item["kind"]})
            dt = time.monotonic() - t0
            extracted.add(item["name"])
            state["extract_seconds"] += dt
            state["extracted_tokens"] += shard.tokens
            pool.refresh()
            log(f"extracted {item['name']}: {shard.tokens} tokens in {dt:.0f}s "
                f"({shard.tokens / dt:.0f} tok/s); total {state['extracted_tokens']}")  # fmt: skip
            continue

        t0 = time.monotonic()
        lr = lr_at(state["step"], args)
        for group in opt.param_groups:
            group["lr"] = lr
        tokens = 0
        step_loss = step_weight = 0.0
        while tokens < args.tokens_per_step:
            ids, hidden, start = pool.sample(rng)
            if len(ids) < 4:
                continue
            select = training_selection(len(ids) - 1, start, args.max_positions, rng)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss, hits, counts = draft_losses(
                    model, ids, hidden, embed, head, args.unroll, args.reg, select
                )
            (loss / args.tokens_per_step).backward()
            tokens += counts[0]
            step_loss += float(loss.detach())
            step_weight += counts[0]
            hit_sum += hits[0]
            count_sum += counts[0]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        state["step"] += 1
        state["tokens_seen"] += tokens
        state["train_seconds"] += time.monotonic() - t0
        loss_sum += step_loss
        weight_sum += step_weight
        if state["step"] % 10 == 0:
            state["recent_loss"] = round(loss_sum / max(weight_sum, 1), 4)
            state["recent_top1"] = round(hit_sum / max(count_sum, 1), 4)
            log(f"step {state['step']} lr {lr:.2e} loss {state['recent_loss']} "
                f"top1 {state['recent_top1']} tokens {state['tokens_seen']} "
                f"({tokens / (time.monotonic() - t0):.0f} tok/s)")  # fmt: skip
            loss_sum = weight_sum = 0.0
            hit_sum = count_sum = 0
        if state["step"] % args.eval_every == 0:
            checkpoint(evaluate_now=True)
            last_ckpt = time.monotonic()
        elif time.monotonic() - last_ckpt > 600:
            checkpoint(evaluate_now=False)
            last_ckpt = time.monotonic()
    bar.close()
    checkpoint(evaluate_now=True)
    log(f"time is up at step {state['step']}; checkpoint {ckpt_path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, required=True, help="stop (and checkpoint) then")
    parser.add_argument("--work-dir", type=Path, default=default_work_dir())
    parser.add_argument("--export", type=Path, default=DEFAULT_EXPORT,
                        help="folder for the best draft so far (empty string: none)")  # fmt: skip
    parser.add_argument("--max-tokens", type=int, default=1_000_000, help="extracted tokens")
    parser.add_argument("--sharegpt-items", type=int, default=60,
                        help="ShareGPT gen batches (and as many forward batches) in the plan")  # fmt: skip
    parser.add_argument("--reuse", type=float, default=2.0,
                        help="train on at most this many x the extracted tokens before extracting")  # fmt: skip
    parser.add_argument("--tokens-per-step", type=int, default=2048)
    parser.add_argument("--max-positions", type=int, default=512,
                        help="scored positions per sequence (the vocabulary projection's cost)")  # fmt: skip
    parser.add_argument("--unroll", type=int, default=3)
    parser.add_argument("--reg", type=float, default=0.5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default one core)")
    parser.add_argument("--lr", type=float, default=6e-4)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--total-steps", type=int, default=8000)
    parser.add_argument("--eval-every", type=int, default=100)
    args = parser.parse_args(argv)
    if args.export is not None and str(args.export) in ("", "."):
        args.export = None
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
