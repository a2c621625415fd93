"""Overload: a burst far beyond what the server sustains, then drain; nothing may be lost.

    python benchmarks/overload.py [--burst N] [--max-queued N] [--policy adaserve|static]

A CPU server (tiny fixture model, EAGLE, `--max-running-requests 4`, `--max-queued-requests`)
receives `--burst` requests at once (default 160: 10x the 4 running + 12 queued it can hold).
Every request must end with a response: completed, or rejected with an error. After the drain
the KV pool must be empty again. Prints the counts, the distinct error messages, the KV tokens
still held; last line `kv_tokens_after_drain=<n>` (goal 0).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import requests

from sgl_adaspec.local_server.burst import burst, kv_tokens_used, metric
from sgl_adaspec.models.tiny import ensure_models
from sgl_adaspec.local_server.launch import Server, eagle_flags

MAX_RUNNING = 4


def overload_flags(draft: Path, policy: str, max_queued: int) -> tuple[str, ...]:
    return (
        *eagle_flags(draft), "--spec-policy", policy, "--enable-metrics",
        "--max-queued-requests", str(max_queued),
        "--max-running-requests", str(MAX_RUNNING),  # the last occurrence wins
    )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--burst", type=int, default=160)
    parser.add_argument("--max-queued", type=int, default=12)
    parser.add_argument("--policy", default="adaserve")
    args = parser.parse_args()

    models = ensure_models()
    flags = overload_flags(models.eagle_draft, args.policy, args.max_queued)
    log = Path(tempfile.mkdtemp(prefix="overload_")) / "server.log"
    with Server(models.target, extra_args=flags, log_path=log) as server:
        result = burst(server.url, args.burst)
        time.sleep(2.0)  # let the scheduler publish its last gauges
        used = kv_tokens_used(server.url)
        running = metric(server.url, "sglang:num_running_reqs")
        queued = metric(server.url, "sglang:num_queue_reqs")
        healthy = requests.get(f"{server.url}/health", timeout=30).status_code == 200

    errors = result.errors()
    print(f"burst of {args.burst} requests (max running {MAX_RUNNING}, max queued "
          f"{args.max_queued}) answered in {result.seconds:.1f} s")
    print(f"completed: {result.completed}; rejected or aborted: {sum(errors.values())}")
    for message, n in errors.most_common():
        print(f"  {n:4d} x {message}")
    print(f"every request answered: {len(result.outcomes) == args.burst}; "
          f"server healthy after: {healthy}")
    print(f"after drain: running {running:.0f}, queued {queued:.0f}; server log: {log}")
    print(f"kv_tokens_after_drain={used}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
