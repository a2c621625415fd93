"""Calibrate the simulator's acceptance model on a real same-tokenizer pair.

    python -m sgl_adaspec.sim.calibration record   # needs the models; ~28 min on one thread
    python -m sgl_adaspec.sim.calibration fit      # stats -> model JSON + plot, no models

`record` defaults to the committed sample (64 coding, 72 chat, 40 summarization prompts, seed 0)
and is resumable: rows are appended to the cache as batches finish, batches go round robin over
the classes (so a run stopped by `--max-minutes` stays balanced), then it fits. `fit` refits the
model JSON and the figure from the stats JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from sgl_adaspec.data import SPEC_BENCH_QUESTIONS
from sgl_adaspec.sim.calibration.outputs import (
    FIGURE_PATH,
    MODEL_PATH,
    STATS_PATH,
    write_fit,
    write_outputs,
)
from sgl_adaspec.sim.calibration.prompts import select_prompts
from sgl_adaspec.sim.calibration.record import (
    BATCH_SIZE,
    MAX_NEW_TOKENS,
    Recorder,
    calibration_cache_dir,
    read_cache,
)
from sgl_adaspec.sim.calibration.stats import CLASSES, stats_from_json


def cmd_record(args: argparse.Namespace) -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    from sgl_adaspec.models import qwen_coder

    torch.set_num_threads(1)
    per_class = {"coding": args.coding_prompts, "chat": args.chat_prompts,
                 "summarization": args.summarization_prompts}  # fmt: skip
    prompts = select_prompts(per_class, args.spec_bench, args.coding, args.seed, args.cache_dir)
    cache_path = args.cache_dir / f"qwen25coder-{args.max_new_tokens}.jsonl"
    done = read_cache(cache_path)
    todo = [p for p in prompts if p.key not in done]
    print(f"{len(prompts)} prompts, {len(prompts) - len(todo)} already in {cache_path}", flush=True)
    started = time.monotonic()
    if todo:
        target_dir, draft_dir = qwen_coder.prepare_target(), qwen_coder.prepare_draft()
        recorder = Recorder(target_dir, draft_dir, args.max_new_tokens)
        print(f"models loaded ({recorder.dtype}) in {time.monotonic() - started:.0f} s", flush=True)
        batches = []
        for category in CLASSES:
            mine = sorted(
                ((len(ids), p, ids) for p in todo if p.category == category
                 for ids in [recorder.prompt_ids(p)]), key=lambda x: x[0])  # fmt: skip
            batches.append([mine[i : i + args.batch_size]
                            for i in range(0, len(mine), args.batch_size)])  # fmt: skip
        # Round robin over classes, so a run stopped by --max-minutes stays balanced.
        order = _interleave(batches)
        deadline = started + 60 * args.max_minutes if args.max_minutes else None
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        for number, batch in enumerate(order, 1):
            if deadline and time.monotonic() > deadline:
                print(f"--max-minutes reached: {len(order) - number + 1} batches left", flush=True)
                break
            t0 = time.monotonic()
            outputs = recorder.greedy([ids for _, _, ids in batch])
            t_gen = time.monotonic() - t0
            lines = []
            for (_, prompt, ids), out in zip(batch, outputs):
                t1 = time.monotonic()
                top_p, rank = recorder.teacher_forced(ids, out) if out else ([], [])
                lines.append(json.dumps({
                    "key": prompt.key, "category": prompt.category, "source": prompt.source,
                    "id": prompt.ident, "prompt_len": len(ids), "output_len": len(out),
                    "output_ids": out, "top_p": top_p, "rank": rank, "dtype": recorder.dtype,
                    "seconds": round(t_gen / len(batch) + time.monotonic() - t1, 3),
                }))  # fmt: skip
            with open(cache_path, "a") as sink:
                sink.write("".join(line + "\n" for line in lines))
            took = time.monotonic() - t0
            tokens = sum(len(o) for o in outputs)
            print(
                f"[{number}/{len(order)}] {batch[0][1].category}: {len(batch)} prompts, "
                f"{batch[0][0]}-{batch[-1][0]} prompt tokens, {tokens} output tokens, "
                f"{took:.1f} s (generate {t_gen:.1f} s); {time.monotonic() - started:.0f} s total",
                flush=True,
            )
    done = read_cache(cache_path)
    rows = [done[p.key] for p in prompts if p.key in done]
    write_outputs(rows, prompts, args, cache_path)
    return 0


def _interleave(groups: list[list]) -> list:
    out = []
    for i in range(max((len(g) for g in groups), default=0)):
        out += [g[i] for g in groups if i < len(g)]
    return out


def cmd_fit(args: argparse.Namespace) -> int:
    classes, provenance = stats_from_json(json.loads(args.stats.read_text()))
    write_fit(classes, provenance, args.stats, args.model, args.figure)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sgl_adaspec.sim.calibration",
                                     description=__doc__.splitlines()[0])  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="run the models on the prompts, then fit")
    rec.add_argument("--coding-prompts", type=int, default=64)
    rec.add_argument("--chat-prompts", type=int, default=72)
    rec.add_argument("--summarization-prompts", type=int, default=40)
    rec.add_argument("--coding", choices=("humaneval", "spec-bench"), default="humaneval")
    rec.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS)
    rec.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    rec.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="start no new batch after this long (the rest stays for a rerun)",
    )
    rec.add_argument("--seed", type=int, default=0)
    rec.add_argument("--spec-bench", type=Path, default=SPEC_BENCH_QUESTIONS)
    rec.add_argument("--cache-dir", type=Path, default=None)
    fit = sub.add_parser("fit", help="refit the model JSON and the plot from the stats")
    for p in (rec, fit):
        p.add_argument("--stats", type=Path, default=STATS_PATH)
        p.add_argument("--model", type=Path, default=MODEL_PATH)
        p.add_argument("--figure", type=Path, default=FIGURE_PATH)
    args = parser.parse_args(argv)
    if args.command == "record":
        args.cache_dir = args.cache_dir or calibration_cache_dir()
        return cmd_record(args)
    return cmd_fit(args)
