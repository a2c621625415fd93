"""Soak: steady mixed-SLO load for a while; resident memory must not grow.

    python benchmarks/soak.py [--minutes 30] [--concurrency 4]

Runs a CPU server (tiny fixture model, EAGLE, `--spec-policy adaserve`), warms it up, records
the resident memory (RSS) of the server's whole process tree, keeps `--concurrency` clients
sending requests with varied SLOs, lengths and sampling for `--minutes`, then records RSS again.
Last line `rss_growth_pct=<x>` (goal <= 5).
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import requests

from sgl_adaspec.local_server.burst import kv_tokens_used
from sgl_adaspec.models.tiny import ensure_models
from sgl_adaspec.local_server.launch import Server, eagle_flags

SLOS = ({"tpot_slo_ms": 5}, {"slo_class": "chat"}, {"slo_class": "coding"}, {})


def tree_rss_bytes(pid: int) -> int:
    root = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])


def client(url: str, stop: threading.Event, seed: int, counts: list[int]) -> None:
    rng = random.Random(seed)
    for i in itertools.count():
        if stop.is_set():
            return
        body = {
            "text": f"# {seed}-{i}\n" + "x = 1\n" * rng.randint(1, 40),
            "sampling_params": {
                "temperature": rng.choice((0.0, 0.0, 0.8)),
                "max_new_tokens": rng.randint(4, 64),
                "custom_params": rng.choice(SLOS),
            },
        }
        ok = requests.post(f"{url}/generate", json=body, timeout=600).status_code == 200
        counts[0 if ok else 1] += 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()

    models = ensure_models()
    flags = (*eagle_flags(models.eagle_draft), "--spec-policy", "adaserve")
    log = Path(tempfile.mkdtemp(prefix="soak_")) / "server.log"
    with Server(models.target, extra_args=flags, log_path=log) as server:
        for i in range(20):  # warm-up: allocator pools, caches, lazy imports
            server.generate(f"# warm {i}\ndef f():", 32)
        rss_start = tree_rss_bytes(server.process.pid)
        stop, counts = threading.Event(), [0, 0]
        threads = [
            threading.Thread(target=client, args=(server.url, stop, seed, counts))
            for seed in range(args.concurrency)
        ]
        for thread in threads:
            thread.start()
        time.sleep(args.minutes * 60)
        stop.set()
        for thread in threads:
            thread.join()
        rss_end = tree_rss_bytes(server.process.pid)
        kv_left = kv_tokens_used(server.url)
    growth = 100.0 * (rss_end - rss_start) / rss_start
    print(f"{args.minutes:g} min, {args.concurrency} clients: {counts[0]} requests ok, "
          f"{counts[1]} failed; KV tokens held after: {kv_left}")
    print(f"server tree RSS: {rss_start / 2**20:.1f} MiB -> {rss_end / 2**20:.1f} MiB; log: {log}")
    print(f"rss_growth_pct={growth:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
