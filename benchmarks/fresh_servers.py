"""Does a fresh adaserve server find the speculation that pays? Fresh servers, one at a time.

    python benchmarks/fresh_servers.py [--servers K] [--tokens N] [--pair bigram|bigram-deep]

Each of K fresh adaserve servers (EAGLE steps 4, topk 2, 8 draft tokens, as in
`cost_aware.py`) on the tiny bigram pair (its draft is always right) is driven as
`cost_aware.py` drives one in its warm-up round: 3 batches each at 1, 4 and 8 concurrent
requests of `--tokens` tokens, classes coding / chat / summarization in turn, with the TPOT SLOs
of `sgl_adaspec/data/slo_classes.yaml` against no speculation's median TPOT at that load (measured
first on one server without speculation). Per server: its speculative and plain iterations,
why each speculative one ran, the wall times of its first speculative iterations (the first
pays one-off set-up: `Outcome.warm_up`) and its median TPOT per load. A server that ran more
plain iterations than speculative ones stood down on a pair where speculation pays at 8
requests (static EAGLE ran faster than no speculation there: docs/results.md).
Last line:
fresh_servers_standing_down=<servers of K that stood down>.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cost_aware import pair, run_batch, slos_of  # noqa: E402

from sgl_adaspec.bench.batch_loads import builtin_prompts  # noqa: E402
from sgl_adaspec.bench.server_probe import adaspec_stats, server_info  # noqa: E402
from sgl_adaspec.local_server.launch import Server, eagle_flags  # noqa: E402

LOADS = (1, 4, 8)
BATCHES = 3
# What /server_info's last plan shows of a server's choice.
PLAN_FIELDS = (
    "requests", "depth", "width", "tokens_per_ms", "plain_tokens_per_ms", "iteration_ms",
    "plain_ms", "delivered_over_planned",
)  # fmt: skip


def baselines(target: Path, texts: list[str], tokens: int) -> dict[int, list]:
    """No speculation's requests per load, `BATCHES` batches each."""
    with Server(target) as server:
        run_batch(server.url, texts[:1], 4, None)  # warm-up
        return {
            n: [r for _ in range(BATCHES) for r in run_batch(server.url, texts[:n], tokens, None)]
            for n in LOADS
        }


def one_server(target: Path, draft: Path, texts, tokens: int, baseline) -> tuple[dict, dict]:
    """A fresh adaserve server driven load by load: (its statistics, median TPOT per load)."""
    flags = ("--spec-policy", "adaserve", *eagle_flags(draft, 4, 2, 8))
    with Server(target, flags) as server:
        tpot = {}
        for n in LOADS:
            slos = slos_of(baseline[n])
            served = [
                r for _ in range(BATCHES) for r in run_batch(server.url, texts[:n], tokens, slos)
            ]
            tpot[n] = statistics.median(r.tpot_ms for r in served)
        return adaspec_stats(server_info(server.url)), tpot


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=48, help="new tokens per request")
    parser.add_argument("--pair", default="bigram", choices=("bigram", "bigram-deep"))
    args = parser.parse_args(argv)
    target, draft = pair(args.pair)
    texts = builtin_prompts(max(LOADS))
    baseline = baselines(target, texts, args.tokens)
    none_ms = {n: statistics.median(r.tpot_ms for r in baseline[n]) for n in LOADS}
    print("no speculation, median TPOT ms by load:", {n: round(ms, 2) for n, ms in none_ms.items()})
    standing_down = 0
    for index in range(args.servers):
        stats, tpot = one_server(target, draft, texts, args.tokens, baseline)
        speculative, plain = stats["iterations"], stats["plain_iterations"]
        first = stats["first_speculative_iteration_ms"]
        warm_up = first[0] / statistics.median(first[1:]) if len(first) > 1 else None
        stood_down = plain > speculative
        standing_down += stood_down
        plan = {key: (stats["last_plan"] or {}).get(key) for key in PLAN_FIELDS}
        print(
            f"server {index + 1}/{args.servers}: {speculative} speculative iterations "
            f"({stats['speculation_reasons']}), {plain} plain"
            f"{' -- stood down' if stood_down else ''}; last plan {plan}; first speculative "
            f"iterations {first} ms (the first over the median of the next: "
            f"{'-' if warm_up is None else f'{warm_up:.2f}'}); median TPOT ms by load "
            f"{ {n: round(ms, 2) for n, ms in tpot.items()} }",
            flush=True,
        )
    print(f"fresh_servers_standing_down={standing_down}")


if __name__ == "__main__":
    main()
