"""How far apart identical servers run on this host: the noise floor of any TPOT ratio of two
server processes (what `cost_aware.py`'s `--server-sets` averages over).

    python benchmarks/same_server_spread.py [--pair smollm2|bigram] [--servers N] [--tokens N]
                                            [--repeats R]

N servers without speculation, identical flags, run side by side (each sleeps when idle); one
request at a time goes to each in turn, R times, so a drift of the host's speed falls on all of
them alike. Prints each server's median TPOT. Last line:
same_server_tpot_spread=<slowest / fastest median TPOT>.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from cost_aware import pair  # noqa: E402

from sgl_adaspec.bench.batch_loads import builtin_prompts  # noqa: E402
from sgl_adaspec.local_server.client import stream_generate  # noqa: E402
from sgl_adaspec.local_server.launch import Server  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="smollm2", choices=("smollm2", "bigram"))
    parser.add_argument("--servers", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per request")
    parser.add_argument("--repeats", type=int, default=8, help="requests per server")
    args = parser.parse_args()
    target, _ = pair(args.pair)
    text = builtin_prompts(1)[0]
    servers = [Server(target) for _ in range(args.servers)]
    with contextlib.ExitStack() as stack:
        for server in servers:
            stack.enter_context(server)
        for server in servers:
            stream_generate(server.url, text, 8, ignore_eos=True)  # warm-up
        tpot = [[] for _ in servers]
        for _ in range(args.repeats):
            for server, values in zip(servers, tpot):
                values.append(
                    stream_generate(server.url, text, args.tokens, ignore_eos=True).tpot_ms
                )
    medians = [statistics.median(values) for values in tpot]
    head = f"{args.pair}: {args.servers} identical servers without speculation"
    print(f"{head}, one request at a time, {args.tokens} tokens each")
    for index, values in enumerate(tpot):
        listed = ", ".join(f"{v:.1f}" for v in values)
        print(f"  server {index + 1}: median TPOT {medians[index]:7.2f} ms  ({listed})")
    print(f"same_server_tpot_spread={max(medians) / min(medians):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
