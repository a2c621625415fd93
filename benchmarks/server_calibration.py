"""Calibrated acceptance on the CPU server: predicted / observed accepted draft tokens per verify,
after the calibration's warm-up, SmolLM2-135M-Instruct + the committed EAGLE draft.

    python benchmarks/server_calibration.py [--rounds R] [--concurrency N] [--tokens T]
                                            [--budget-rule cost|knee,...]

The check the cost rule's own runs cannot make: on this CPU adaserve stands down in most
iterations of SmolLM2 (docs/results.md), so a run of `cost_aware.py` holds ~20 speculative
iterations and ~10 accepted draft tokens, whose ratio is mostly noise. Here each budget rule
serves `--rounds` batches of `--concurrency` greedy requests (the built-in prompts, every request
decoding `--tokens` tokens); "knee" speculates in every iteration, so its calibration is judged
on hundreds of verifies. Both run the same calibration (`speculative/accept_calibration.py`),
which learns from every verified node whatever selected it. Per rule it prints the server's
figures after warm-up (`settled_*` in `/server_info`: every iteration predicted after
`CALIBRATION_WARMUP_TRIALS` trials): calibrated / observed, raw path probability / observed, and
the accepted draft tokens and iterations behind them, then the ratio over each half of those
iterations' tokens (a drift between halves would show a calibration still learning).

Last line: server_calibrated_over_observed=<calibrated / observed of the first rule listed>.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sgl_adaspec.bench.batch_loads import builtin_prompts
from sgl_adaspec.bench.server_probe import adaspec_stats, server_info
from sgl_adaspec.local_server.client import stream_generate
from sgl_adaspec.local_server.launch import Server, eagle_flags

STEPS, TOPK, NUM_DRAFT_TOKENS = 4, 2, 8  # as cost_aware.py


def settled(stats: dict) -> tuple[float, float, float, int]:
    """(calibrated, raw, observed) accepted draft tokens after warm-up, and the iterations."""
    observed = stats["settled_accepted_draft_tokens"]
    calibrated = (stats["settled_calibrated_over_observed"] or 0.0) * observed
    raw = (stats["settled_predicted_over_observed"] or 0.0) * observed
    return calibrated, raw, observed, stats["settled_iterations"]


def serve_rounds(server: Server, texts: list[str], rounds: int, tokens: int) -> None:
    with ThreadPoolExecutor(len(texts)) as pool:
        for r in range(rounds):
            # Rotate the prompts so each round batches them differently.
            batch = texts[r % len(texts) :] + texts[: r % len(texts)]
            list(pool.map(lambda t: stream_generate(server.url, t, tokens, ignore_eos=True), batch))


def ratio(a: float, b: float) -> str:
    return f"{a / b:.3f}" if b > 0 else "-"


def run_rule(rule: str, target: Path, draft: Path, args, logs: Path) -> float | None:
    texts = builtin_prompts(args.concurrency)
    flags = (
        *eagle_flags(draft, STEPS, TOPK, NUM_DRAFT_TOKENS),
        "--spec-policy", "adaserve", "--adaserve-budget-rule", rule,
    )  # fmt: skip
    with Server(target, flags, log_path=logs / f"adaserve-{rule}.log") as server:
        serve_rounds(server, texts, args.rounds // 2, args.tokens)
        first = settled(adaspec_stats(server_info(server.url)))
        serve_rounds(server, texts, args.rounds - args.rounds // 2, args.tokens)
        stats = adaspec_stats(server_info(server.url))
    calibrated, raw, observed, iterations = settled(stats)
    second = [b - a for a, b in zip(first, (calibrated, raw, observed, iterations))]
    print(
        f"{rule}: {stats['iterations']} speculative iterations, {stats['plain_iterations']} "
        f"plain, {stats['calibration_trials']} calibration trials; after warm-up "
        f"{iterations} iterations, {observed:.0f} accepted draft tokens: calibrated / observed "
        f"{ratio(calibrated, observed)}, raw path probability / observed {ratio(raw, observed)}; "
        f"first half of the rounds {ratio(first[0], first[2])} ({first[2]:.0f} tokens), "
        f"second half {ratio(second[0], second[2])} ({second[2]:.0f} tokens); "
        f"decayed (last ~50 iterations) {stats['acceptance_calibrated_over_observed']}"
    )
    return calibrated / observed if observed > 0 else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12, help="batches per budget rule")
    parser.add_argument("--concurrency", type=int, default=8, help="requests per batch")
    parser.add_argument("--tokens", type=int, default=96, help="new tokens per request")
    parser.add_argument("--budget-rule", default="knee,cost", help="adaserve rules, in order")
    args = parser.parse_args()
    rules = args.budget_rule.split(",")
    if args.rounds < 2 or not set(rules) <= {"knee", "cost"}:
        parser.error("--rounds must be >= 2 and --budget-rule a list of knee, cost")
    from sgl_adaspec.models.smollm2 import prepare_smollm2
    from sgl_adaspec.models.train_eagle import DEFAULT_EXPORT

    target, draft = prepare_smollm2(), DEFAULT_EXPORT
    logs = Path(tempfile.mkdtemp(prefix="server-calibration-"))
    print(
        f"SmolLM2-135M + the committed EAGLE draft, EAGLE steps {STEPS}, topk {TOPK}, "
        f"{NUM_DRAFT_TOKENS} draft tokens; {args.rounds} batches of {args.concurrency} x "
        f"{args.tokens} tokens per rule; server logs in {logs}"
    )
    results = [run_rule(rule, target, draft, args, logs) for rule in rules]
    first = results[0]
    print(f"server_calibrated_over_observed={'nan' if first is None else f'{first:.3f}'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
