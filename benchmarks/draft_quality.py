"""Quality of the SmolLM2-135M EAGLE draft: offline agreement and acceptance through SGLang.

    python benchmarks/draft_quality.py [--draft DIR] [--prompts N] [--max-new N] [--skip-server]

1. Top-1 agreement, teacher-forced: the held-out Spec-Bench questions (every 6th, never trained
   on) with the float32 target's greedy continuation (128 tokens; built once and cached by
   ``sgl_adaspec.models.eagle_data_plan``). The draft runs in float32 from the exported bf16
   weights, fed exactly what SGLang feeds it; at step s > 1 it consumes its own hidden state
   (draft decode). Reported per step over the generated tokens: fraction where the draft's argmax
   equals the target's. Step 1 is the headline, also split by Spec-Bench category.
2. Acceptance through a real SGLang server on CPU (the project's path, EAGLE depth 4, topk 2,
   8 draft tokens, greedy): mean accepted tokens per verify = sum of completion tokens / sum of
   verify passes (SGLang's ``spec_accept_length`` aggregated), over ``--prompts`` held-out
   questions. Also checks the greedy outputs equal the cached float32 HF continuations.

Last line: ``draft_top1_agreement=<step-1 agreement>``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
import torch
from safetensors import safe_open

from sgl_adaspec.local_server.launch import Server, eagle_flags
from sgl_adaspec.models.copy_rule import copy_rule_guesses
from sgl_adaspec.models.eagle_data import Shard, spec_bench_heldout_categories
from sgl_adaspec.models.eagle_data_plan import EVAL_MAX_NEW, build_eval_set
from sgl_adaspec.models.eagle_draft import load_draft
from sgl_adaspec.models.eagle_loss import sequence_inputs
from sgl_adaspec.models.smollm2 import prepare_smollm2
from sgl_adaspec.models.train_eagle import DEFAULT_EXPORT, default_work_dir

STEPS, TOPK, NUM_DRAFT_TOKENS = 4, 2, 8


def target_embedding(target: Path) -> torch.Tensor:
    with safe_open(str(target / "model.safetensors"), framework="pt") as f:
        return f.get_tensor("model.embed_tokens.weight").float()  # tied: also the lm_head


@torch.no_grad()
def top1_agreement(
    draft_dir: Path, shard: Shard, embed: torch.Tensor, steps: int
) -> tuple[list[float], list[tuple[int, int]]]:
    """Agreement per draft step, and each sequence's step-1 counts (``STEP1_COUNTS``)."""
    draft = load_draft(draft_dir, torch.float32)
    hits, counts = [0] * steps, [0] * steps
    per_sequence = []
    for i in range(len(shard)):
        ids, hidden, start = shard.sequence(i)
        embeds, h_in, positions, h_next = sequence_inputs(ids, hidden.float(), embed)
        outs = draft.unrolled(embeds, h_in, positions, steps)
        for s, out in enumerate(outs, start=1):
            # generated tokens only (position t predicts token t+2), with step-s history
            rows = torch.arange(max(start - 1, s - 1), len(positions))
            target_top = (h_next[rows] @ embed.T).argmax(-1)
            top = (out[0, rows] @ embed.T).argmax(-1)
            hits[s - 1] += int((top == target_top).sum())
            counts[s - 1] += len(rows)
            if s == 1:
                hit = top == target_top
                copy = copy_rule_guesses(ids)[rows]
                seen = copy >= 0
                counts_1 = (hit.sum(), len(rows), seen.sum(), hit[seen].sum(),
                            (copy == target_top)[seen].sum())  # fmt: skip
                per_sequence.append(tuple(int(c) for c in counts_1))
    return [h / max(c, 1) for h, c in zip(hits, counts)], per_sequence


STEP1_COUNTS = ("hits", "positions", "seen", "hits_seen", "copy_hits_seen")


def by_category(per_sequence: list[tuple[int, ...]], categories: list[str]) -> dict[str, dict]:
    """Step-1 agreement per Spec-Bench category, and on positions whose current token occurred
    before (``seen``): the draft's agreement there next to the copy rule's."""
    totals: dict[str, list[int]] = {}
    for counts, category in zip(per_sequence, categories):
        t = totals.setdefault(category, [0] * (len(STEP1_COUNTS) + 1))
        for k, c in enumerate((1, *counts)):
            t[k] += c
    report = {}
    for category, counts in sorted(totals.items()):
        questions, hits, positions, seen, hits_seen, copy_seen = counts
        report[category] = {
            "questions": questions, "positions": positions, "agreement": hits / max(positions, 1),
            "seen_share": seen / max(positions, 1), "draft_on_seen": hits_seen / max(seen, 1),
            "copy_rule_on_seen": copy_seen / max(seen, 1),
        }  # fmt: skip
    return report


def server_acceptance(target: Path, draft: Path, shard: Shard, prompts: int, max_new: int):
    log = Path(tempfile.mkdtemp(prefix="draft_quality_")) / "server.log"
    flags = eagle_flags(draft, steps=STEPS, topk=TOPK, num_draft_tokens=NUM_DRAFT_TOKENS)
    chosen = list(range(min(prompts, len(shard))))

    def run(server: Server, i: int) -> dict:
        ids, _, start = shard.sequence(i)
        body = {
            "input_ids": ids[:start].tolist(),
            "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new},
        }
        response = requests.post(f"{server.url}/generate", json=body, timeout=900)
        response.raise_for_status()
        out = response.json()
        expected = ids[start:].tolist()
        got = out["output_ids"] if "output_ids" in out else None
        return {"meta": out["meta_info"], "got": got, "expected": expected}

    t0 = time.monotonic()
    with Server(target, extra_args=flags, log_path=log, startup_timeout_s=600) as server:
        with ThreadPoolExecutor(max_workers=4) as pool:
            results = list(pool.map(lambda i: run(server, i), chosen))
    elapsed = time.monotonic() - t0
    completion = sum(r["meta"]["completion_tokens"] for r in results)
    verify = sum(r["meta"].get("spec_verify_ct", 0) for r in results)
    # The cached continuation (EVAL_MAX_NEW tokens, its final one dropped): compare the
    # common length.
    def agrees(r: dict) -> bool:
        n = min(len(r["got"] or []), len(r["expected"]))
        return r["got"] is not None and r["got"][:n] == r["expected"][:n]

    same = sum(agrees(r) for r in results)
    return {
        "prompts": len(results),
        "completion_tokens": completion,
        "verify_passes": verify,
        "accept_length": completion / max(verify, 1),
        "per_prompt_accept_length": [
            round(r["meta"].get("spec_accept_length", 0.0), 3) for r in results
        ],
        "greedy_equal_to_hf": f"{same}/{len(results)}",
        "seconds": round(elapsed, 1),
        "server_log": str(log),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draft", type=Path, default=DEFAULT_EXPORT)
    parser.add_argument("--work-dir", type=Path, default=default_work_dir())
    parser.add_argument("--prompts", type=int, default=16, help="held-out prompts via SGLang")
    parser.add_argument("--max-new", type=int, default=EVAL_MAX_NEW)
    parser.add_argument("--skip-server", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    target = prepare_smollm2()
    shard = build_eval_set(target, args.work_dir / "eval" / "heldout.safetensors")
    embed = target_embedding(target)
    t0 = time.monotonic()
    agreement, per_sequence = top1_agreement(args.draft, shard, embed, STEPS)
    print(f"held-out: {len(shard)} questions, {shard.tokens} tokens ({time.monotonic() - t0:.0f}s)")
    for s, a in enumerate(agreement, start=1):
        print(f"top-1 agreement, draft step {s}: {a:.4f}")
    categories = spec_bench_heldout_categories()
    rows = by_category(per_sequence, categories) | by_category(per_sequence, ["all"] * len(shard))
    print("step 1 by category; 'seen' = current token occurred earlier in the text, where the"
          " copy rule (sgl_adaspec.models.copy_rule) can guess:")
    for category, r in rows.items():
        print(f"  {category:15s} {r['agreement']:.3f} ({r['questions']} questions, "
              f"{r['positions']} positions; seen {r['seen_share']:.0%}: draft "
              f"{r['draft_on_seen']:.3f}, copy rule {r['copy_rule_on_seen']:.3f})")  # fmt: skip
    # Teacher-forced chain estimate of accepted tokens per verify along a single path (topk 1).
    chain, alive = 1.0, 1.0
    for a in agreement:
        alive *= a
        chain += alive
    print(f"chain estimate (topk 1, depth {STEPS}): {chain:.3f} tokens per verify")
    if not args.skip_server:
        acceptance = server_acceptance(target, args.draft, shard, args.prompts, args.max_new)
        print("sglang:", json.dumps(acceptance))
        print(
            f"mean accepted tokens per verify (SGLang CPU, depth {STEPS}, topk {TOPK}, "
            f"{NUM_DRAFT_TOKENS} draft tokens): {acceptance['accept_length']:.3f}"
        )
    print(f"draft_top1_agreement={agreement[0]:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
