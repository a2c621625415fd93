"""Throughput of a server at fixed loads: n built-in prompts sent at once, greedy, for the
benchmark scripts that compare server configurations in one run (benchmarks/*.py)."""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import requests

from sgl_adaspec.local_server.client import generate
from sgl_adaspec.local_server.launch import Server


def builtin_prompts(count: int) -> list[str]:
    """The first `count` of the evaluation tool's built-in prompts."""
    from sgl_adaspec.bench.prompts import BUILTIN_PROMPTS

    if count > len(BUILTIN_PROMPTS):
        raise SystemExit(f"--loads: at most {len(BUILTIN_PROMPTS)} concurrent requests")
    return list(BUILTIN_PROMPTS[:count])


def run_load(url: str, batch: list[str], tokens: int) -> tuple[float, list[list[int]]]:
    """Output tokens per second of one batch sent at once, and its outputs."""
    start = time.perf_counter()
    with ThreadPoolExecutor(len(batch)) as pool:
        outs = list(pool.map(lambda p: generate(url, p, tokens), batch))
    produced = sum(o["meta_info"]["completion_tokens"] for o in outs)
    return produced / (time.perf_counter() - start), [o["output_ids"] for o in outs]


def measure_loads(server: Server, loads: list[int], texts: list[str], tokens: int, repeats: int = 3):
    """Start `server`; per load n the median throughput of `repeats` batches of texts[:n] and
    the first batch's outputs; then the server's adaspec statistics (None without a policy)."""
    rates, outputs = {}, {}
    with server:
        generate(server.url, texts[0], 4)  # warm-up
        for n in loads:
            runs = [run_load(server.url, texts[:n], tokens) for _ in range(repeats)]
            rates[n] = statistics.median(r for r, _ in runs)
            outputs[n] = runs[0][1]
        info = requests.get(f"{server.url}/server_info", timeout=60).json()
    return rates, outputs, (info["internal_states"][0].get("adaspec") or {}).get("stats")
