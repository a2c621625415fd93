"""What faser's token-wise early exit saves on CPU: the same faser server with the exit off,
forced on every verify (`always`) and left to the eq. 10 trigger (`auto`), in one run on the
same prompts, with no speculation as the reference.

    python benchmarks/faser_early_exit.py [--loads 1,4,8] [--tokens N] [--exit-layer L] [--topk K]

Pair: SmolLM2-135M-Instruct (30 layers) + the committed EAGLE draft, EAGLE steps 4, topk 2,
8 draft tokens, `--faser-lengths 4` (every request verifies a 4-token chain, so the configs
differ only in the exit), test after `--exit-layer` layers (default 15) with top-`--topk`
(default 10, the paper's K). At each load n the first n built-in prompts are sent at once
(greedy); the figure is output tokens per second of wall time (median of 3). Also printed:
the share of verified draft tokens that exited, accepted tokens per verify (a wrong exit
lowers it), and whether greedy outputs equal no speculation.
Last line: faser_early_exit_throughput_ratio_at_<max load>=<always / off>.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from sgl_adaspec.bench.batch_loads import builtin_prompts, measure_loads
from sgl_adaspec.local_server.launch import Server, eagle_flags

STEPS, TOPK, NUM_DRAFT_TOKENS = 4, 2, 8


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", default="1,4,8", help="concurrent requests per batch")
    parser.add_argument("--tokens", type=int, default=48, help="new tokens per request")
    parser.add_argument("--exit-layer", type=int, default=15)
    parser.add_argument("--topk", type=int, default=10)
    args = parser.parse_args()
    from sgl_adaspec.models.smollm2 import prepare_smollm2
    from sgl_adaspec.models.train_eagle import DEFAULT_EXPORT

    loads = [int(n) for n in args.loads.split(",")]
    texts = builtin_prompts(max(loads))
    logs = Path(tempfile.mkdtemp(prefix="faser_early_exit_"))
    faser = (
        *eagle_flags(DEFAULT_EXPORT, STEPS, TOPK, NUM_DRAFT_TOKENS), "--spec-policy", "faser",
        "--faser-lengths", str(STEPS), "--faser-exit-layer", str(args.exit_layer),
        "--faser-exit-topk", str(args.topk),
    )  # fmt: skip
    configs = {
        "plain": (),
        "off": faser,
        "always": (*faser, "--faser-early-exit", "always"),
        "auto": (*faser, "--faser-early-exit", "auto"),
    }
    results = {}
    for name, flags in configs.items():
        results[name] = measure_loads(
            Server(prepare_smollm2(), flags, log_path=logs / f"{name}.log", startup_timeout_s=600),
            loads, texts, args.tokens,
        )  # fmt: skip
        rates, _, stats = results[name]
        detail = ""
        if stats:
            exited = stats["exited_fraction"]
            test_ms = stats["exit_test_ms_per_token"]
            detail = (f"; exited fraction {exited if exited is None else round(exited, 3)}, "
                      f"test ms per tested token {test_ms if test_ms is None else round(test_ms, 3)}, "
                      f"accepted tokens per verify {stats['accepted_tokens_per_verify']:.2f}")
            profile = stats["cost_profile"]
            if profile:
                tokens, ms = profile["tokens"], profile["latency_ms"]
                detail += (f"; start-up verify profile {(ms[-1] - ms[0]) / (tokens[-1] - tokens[0]):.2f}"
                           f" ms per token")
        by_load = json.dumps({n: round(r, 2) for n, r in rates.items()})
        print(f"{name}: output tok/s by load {by_load}{detail}", flush=True)
    for n in loads:
        same = all(results[c][1][n] == results["plain"][1][n] for c in configs)
        ratios = ", ".join(
            f"{c} / off {results[c][0][n] / results['off'][0][n]:.3f}" for c in ("always", "auto")
        )
        print(f"load {n}: throughput {ratios}; greedy outputs equal to no speculation: {same}")
    print(f"server logs: {logs}")
    top = max(loads)
    print(f"faser_early_exit_throughput_ratio_at_{top}="
          f"{results['always'][0][top] / results['off'][0][top]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
