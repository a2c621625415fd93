"""What draft tiers save on CPU: adaserve with its load-adaptive (d, w) applied to the draft's
beam search (`--draft-tiers on`) vs only to what is verified (`--draft-tiers off`), measured in
one run on the same prompts, with no speculation as the reference.

    python benchmarks/draft_tiers.py [--loads 1,4,8] [--tokens N] [--tiny]

Pair: SmolLM2-135M-Instruct + the committed EAGLE draft (`--tiny`: the random tiny pair), EAGLE
steps 4, topk 4, 8 draft tokens, `--adaserve-verify-tokens-per-step 16
--adaserve-draft-tokens-per-step 8`, so the tier follows the load n: (4, 4) for n = 1, (3, 2)
for 4, (1, 1) for 8. At each load n, the first n of the evaluation tool's built-in prompts are sent at once (greedy); the figure is
the batch's output tokens per second of wall time, and the greedy outputs of the three servers
are compared. Last line: draft_tiers_throughput_ratio_at_<max load>=<on / off>.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from sgl_adaspec.bench.batch_loads import builtin_prompts, measure_loads
from sgl_adaspec.local_server.launch import Server, eagle_flags

STEPS, TOPK, NUM_DRAFT_TOKENS = 4, 4, 8
TIERS = ("--adaserve-verify-tokens-per-step", "16", "--adaserve-draft-tokens-per-step", "8")


def pair(tiny: bool) -> tuple[Path, Path]:
    if tiny:
        from sgl_adaspec.models.tiny import ensure_models

        models = ensure_models()
        return models.target, models.eagle_draft
    from sgl_adaspec.models.smollm2 import prepare_smollm2
    from sgl_adaspec.models.train_eagle import DEFAULT_EXPORT

    return prepare_smollm2(), DEFAULT_EXPORT


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", default="1,4,8", help="concurrent requests per batch")
    parser.add_argument("--tokens", type=int, default=48, help="new tokens per request")
    parser.add_argument("--tiny", action="store_true", help="the random tiny pair")
    args = parser.parse_args()
    loads = [int(n) for n in args.loads.split(",")]
    target, draft = pair(args.tiny)
    texts = builtin_prompts(max(loads))
    logs = Path(tempfile.mkdtemp(prefix="draft_tiers_"))
    spec = (
        *eagle_flags(draft, STEPS, TOPK, NUM_DRAFT_TOKENS), "--spec-policy", "adaserve", *TIERS
    )  # fmt: skip
    configs = {
        "plain": (),
        "tiers-off": (*spec, "--draft-tiers", "off"),
        "tiers-on": (*spec, "--draft-tiers", "on"),
    }
    results = {}
    for name, flags in configs.items():
        server = Server(target, flags, log_path=logs / f"{name}.log")
        results[name] = measure_loads(server, loads, texts, args.tokens)
        rates, _, stats = results[name]
        detail = ""
        if stats:
            detail = (f"; draft rows per iteration {stats['draft_rows_per_iteration']:.1f}, "
                      f"accepted tokens per verify {stats['accepted_tokens_per_verify']:.2f}")
        by_load = json.dumps({n: round(r, 2) for n, r in rates.items()})
        print(f"{name}: output tok/s by load {by_load}{detail}", flush=True)
    for n in loads:
        same = all(results[c][1][n] == results["plain"][1][n] for c in ("tiers-on", "tiers-off"))
        ratio = results["tiers-on"][0][n] / results["tiers-off"][0][n]
        print(f"load {n}: tiers on / off throughput {ratio:.3f}; greedy outputs equal to no "
              f"speculation: {same}")
    print(f"server logs: {logs}")
    top = max(loads)
    print(f"draft_tiers_throughput_ratio_at_{top}="
          f"{results['tiers-on'][0][top] / results['tiers-off'][0][top]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
