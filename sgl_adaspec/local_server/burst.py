"""Send a burst of requests to a running server and account for every one of them."""

from __future__ import annotations

import collections
import concurrent.futures
import time
from dataclasses import dataclass

import requests

COMPLETED = "completed"


@dataclass(frozen=True)
class BurstResult:
    outcomes: list[tuple[int, str]]  # (HTTP status or -1, "completed" or the error text)
    seconds: float

    @property
    def completed(self) -> int:
        return sum(1 for _, message in self.outcomes if message == COMPLETED)

    def errors(self) -> collections.Counter:
        return collections.Counter(m for _, m in self.outcomes if m != COMPLETED)


def send_one(url: str, i: int, max_new_tokens: int = 24) -> tuple[int, str]:
    body = {
        "text": f"# job {i}\ndef f(x):",
        "sampling_params": {
            "temperature": 0.0, "max_new_tokens": max_new_tokens,
            "custom_params": {"tpot_slo_ms": 50},
        },
    }  # fmt: skip
    try:
        response = requests.post(f"{url}/generate", json=body, timeout=600)
    except requests.RequestException as exc:
        return -1, f"connection error: {exc}"
    if response.status_code != 200:
        return response.status_code, response.text[:300]
    reason = response.json()["meta_info"].get("finish_reason") or {}
    if reason.get("type") == "abort":
        return 200, f"aborted: {reason.get('message')}"
    return 200, COMPLETED


def burst(url: str, num_requests: int, concurrency: int = 64) -> BurstResult:
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        outcomes = list(pool.map(lambda i: send_one(url, i), range(num_requests)))
    return BurstResult(outcomes, time.perf_counter() - start)


def metric(url: str, name: str) -> float:
    """A gauge from the server's Prometheus endpoint (`--enable-metrics`)."""
    for line in requests.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(f"{name} not in /metrics")


def kv_tokens_used(url: str) -> int:
    """KV slots held by requests right now (the plugin's `/server_info` entry)."""
    info = requests.get(f"{url}/server_info", timeout=30).json()
    return info["internal_states"][0]["adaspec"]["kv_tokens_used"]
