"""Train the EAGLE draft for SmolLM2-135M-Instruct on CPU, resumably, in bounded memory.

    python -m sgl_adaspec.models.train_eagle --minutes 120 [--work-dir DIR] [--export DIR]

One process (one thread) alternates between extracting target features into shards and
training on them, so the learning curve starts early and data keeps growing up to
``--max-tokens``:

* extraction: work items from a fixed plan (``plan.json``, written once): self-distillation
  batches (Spec-Bench training questions first, then ShareGPT first turns; the target continues
  greedily with the chat template applied) and, every third item, ShareGPT conversations through
  one forward pass. See ``eagle_data_plan``. A shard per item; an item is done when its file
  exists.
* training: a step = sequences sampled from the shards, the least used preferred
  (``eagle_shard_pool``; a small LRU of loaded shards bounds RAM) until ``--tokens-per-step`` tokens; loss per draft step s = 1..``--unroll`` (SGLang's
  draft tree: step s > 1 feeds the draft its own previous hidden state) = soft cross-entropy to
  the target's distribution softmax(W h[t+1]) + ``--reg`` * SmoothL1(draft hidden, h[t+1])
  (``eagle_loss``).
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
from pathlib import Path

import torch
from safetensors.torch import load_file
from tqdm import tqdm

from sgl_adaspec.data import SMOLLM2_EAGLE_DRAFT
from sgl_adaspec.models.eagle_data import Shard, Target
from sgl_adaspec.models.eagle_data_plan import build_eval_set, build_plan, extract_item
from sgl_adaspec.models.eagle_draft import WEIGHTS_FILE, DraftShape, EagleDraft, export_draft
from sgl_adaspec.models.eagle_loss import draft_losses, evaluate, training_selection
from sgl_adaspec.models.eagle_shard_pool import ShardPool, estimated_uses
from sgl_adaspec.models.smollm2 import prepare_smollm2
from sgl_adaspec.models.tiny import default_cache_dir

DEFAULT_EXPORT = SMOLLM2_EAGLE_DRAFT


def default_work_dir() -> Path:
    return default_cache_dir().parent / "eagle-smollm2"


def log(msg: str) -> None:
    tqdm.write(f"{time.strftime('%H:%M:%S')} {msg}", file=sys.stdout)  # above a running bar


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
            if (args.export / "learning_curve.jsonl").exists() and not (
                work / "curve.jsonl"
            ).exists():
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
        need_data = (
            state["extracted_tokens"] < args.max_tokens
            and item is not None
            and (state["tokens_seen"] >= args.reuse * state["extracted_tokens"] or not pool.names)
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
