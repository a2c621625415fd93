"""What an iteration without speculation costs in a speculative server, against a server
without speculation: SGLang 0.5.23's steps-0 path (a one-token verify per request, no draft)
as adaserve runs it when speculation does not pay: the draft extend skipped where speculation
pays at no load, kept where it pays for one request alone (`keep_draft_warm`; the server's
`warm_plain_iterations` says which ran).

    python benchmarks/plain_iteration_cost.py [--pair smollm2|bigram] [--tokens N] [--repeats R]

Both servers run side by side (each sleeps when idle) and their requests alternate, one at a
time, so a drift of the host's speed falls on both. adaserve is warmed up first until its cost
model stands down; the probes it still runs (two speculative iterations every 16 to 256 plain
ones) are counted and reported. A third server without speculation runs with SGLang's overlap
schedule off (`none-seq`): what the overlap of scheduling and forward saves a server without
speculation (SGLang turns it off for speculation on CPU; the plugin keeps it since 2026-12-05,
so adaserve runs the overlap schedule here, as on CUDA).
Last line: plain_over_nospec_tpot=<median TPOT ratio adaserve / none>.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).parent))
from cost_aware import pair  # noqa: E402

from sgl_adaspec.bench.batch_loads import builtin_prompts  # noqa: E402
from sgl_adaspec.local_server.client import stream_generate  # noqa: E402
from sgl_adaspec.local_server.launch import Server, eagle_flags  # noqa: E402


def adaserve_stats(url: str) -> dict:
    info = requests.get(f"{url}/server_info", timeout=30).json()
    return info["internal_states"][0]["adaspec"]["stats"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="smollm2", choices=("smollm2", "bigram"))
    parser.add_argument("--tokens", type=int, default=96, help="new tokens per request")
    parser.add_argument("--repeats", type=int, default=5, help="requests per server")
    args = parser.parse_args()
    target, draft = pair(args.pair)
    text = builtin_prompts(1)[0]
    spec = (*eagle_flags(draft, 4, 2, 8), "--spec-policy", "adaserve")
    servers = {
        "none": Server(target),
        "none-seq": Server(target, ("--disable-overlap-schedule",)),
        "adaserve": Server(target, spec),
    }
    with contextlib.ExitStack() as stack:
        for server in servers.values():
            stack.enter_context(server)
        adaserve = servers["adaserve"]
        for name in ("none", "none-seq"):
            stream_generate(servers[name].url, text, 8, ignore_eos=True)
        for _ in range(3):  # adaserve learns what speculation returns here
            stream_generate(adaserve.url, text, args.tokens, ignore_eos=True)
        before = adaserve_stats(adaserve.url)
        tpot = {name: [] for name in servers}
        for _ in range(args.repeats):
            for name, server in servers.items():
                tpot[name].append(stream_generate(server.url, text, args.tokens, ignore_eos=True).tpot_ms)
        after = adaserve_stats(adaserve.url)
    plain = after["plain_iterations"] - before["plain_iterations"]
    spec_iters = after["iterations"] - before["iterations"]
    medians = {name: statistics.median(values) for name, values in tpot.items()}
    print(f"{args.pair}: one request at a time, {args.tokens} tokens, {args.repeats} each")
    for name, values in tpot.items():
        print(f"  {name:<9} median TPOT {medians[name]:8.2f} ms  ({', '.join(f'{v:.1f}' for v in values)})")
    print(f"  adaserve while measured: {plain} iterations without speculation, {spec_iters} "
          f"speculative (probes); last plan {after['last_plan']}")
    print(f"  adaserve / none-seq {medians['adaserve'] / medians['none-seq']:.3f}; "
          f"none-seq / none {medians['none-seq'] / medians['none']:.3f} (the overlap schedule)")
    print(f"plain_over_nospec_tpot={medians['adaserve'] / medians['none']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
