"""What SGLang's overlap schedule does to adaserve on this CPU: adaserve as served (the plugin
keeps the overlap schedule, as CUDA runs it) against adaserve with `--disable-overlap-schedule`
(SGLang's own choice for speculation on CPU), both over a server without speculation.

    python benchmarks/overlap_schedule_cost.py [--pair smollm2|bigram] [--loads 1,8]
                                               [--tokens N] [--rounds R]

The three servers run side by side (each sleeps when idle); at each load n, n built-in prompts
are streamed at once to each server in turn, R rounds after one warm-up batch, so a drift of
the host's speed falls on all three. Prints each server's median (over rounds) of the batch's
median TPOT and the two ratios over no speculation. Last line:
overlap_over_sync_tpot=<max over loads of adaserve with / without the overlap schedule>.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from cost_aware import pair, run_batch  # noqa: E402

from sgl_adaspec.bench.batch_loads import builtin_prompts  # noqa: E402
from sgl_adaspec.local_server.launch import Server, eagle_flags  # noqa: E402


def batch_tpot_ms(url: str, texts: list[str], tokens: int) -> float:
    """The median TPOT of `texts` streamed at once (no SLO)."""
    return statistics.median(served.tpot_ms for served in run_batch(url, texts, tokens, None))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="smollm2", choices=("smollm2", "bigram"))
    parser.add_argument("--loads", default="1,8", help="concurrent requests, comma-separated")
    parser.add_argument("--tokens", type=int, default=96, help="new tokens per request")
    parser.add_argument("--rounds", type=int, default=5, help="counted batches per load")
    args = parser.parse_args()
    loads = [int(n) for n in args.loads.split(",")]
    target, draft = pair(args.pair)
    adaserve = (*eagle_flags(draft, 4, 2, 8), "--spec-policy", "adaserve")
    servers = {
        "none": Server(target),
        "overlap": Server(target, adaserve),
        "sync": Server(target, (*adaserve, "--disable-overlap-schedule")),
    }
    texts = builtin_prompts(max(loads))
    ratios = []
    with contextlib.ExitStack() as stack:
        for server in servers.values():
            stack.enter_context(server)
        for n in loads:
            for server in servers.values():
                batch_tpot_ms(server.url, texts[:n], args.tokens)  # warm-up
            tpot = {name: [] for name in servers}
            for _ in range(args.rounds):
                for name, server in servers.items():
                    tpot[name].append(batch_tpot_ms(server.url, texts[:n], args.tokens))
            med = {name: statistics.median(values) for name, values in tpot.items()}
            ratios.append(med["overlap"] / med["sync"])
            print(
                f"{args.pair} n={n}: median TPOT ms none {med['none']:.2f}, adaserve overlap "
                f"{med['overlap']:.2f} ({med['overlap'] / med['none']:.3f}x), adaserve sync "
                f"{med['sync']:.2f} ({med['sync'] / med['none']:.3f}x)",
                flush=True,
            )
    print(f"overlap_over_sync_tpot={max(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
