"""What the bench asks a running server besides generating: warm-up, the baseline TPOT,
speculation statistics, the served model name.
"""

from __future__ import annotations

import statistics
import time

import requests

from sgl_adaspec.local_server.client import stream_generate

WARMUP_TOKENS = 4
INFO_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 600.0


def warm_up(url: str, prompt: str) -> None:
    """One short request, so the first replayed request does not pay first-call costs."""
    stream_generate(url, prompt, WARMUP_TOKENS)


def measure_baseline_tpot_ms(url: str, prompts: list[str], output_tokens: int) -> float:
    """Baseline TPOT of a server that does not speculate: the median over ``prompts``, sent one
    at a time (batch 1), of (T(n) - T(1)) / (n - 1), T the latency of a whole non-streamed
    greedy request for n tokens (``ignore_eos``). Relative SLO classes multiply it.

    Not timed from the stream: a busy CPU can hold a fast model's chunks and deliver them in one
    burst, which makes a streamed batch-1 TPOT meaningless. A first request caches the prompt so
    both timed requests pay the same (cached) prefill, which the difference then cancels.
    """
    if output_tokens < 2:
        raise ValueError(f"output_tokens must be >= 2, got {output_tokens}")
    tpots_ms = []
    for prompt in prompts:
        _latency_s(url, prompt, 1)  # caches the prompt's prefix
        one, many = _latency_s(url, prompt, 1), _latency_s(url, prompt, output_tokens)
        if many > one:
            tpots_ms.append(1000 * (many - one) / (output_tokens - 1))
    if not tpots_ms:
        raise RuntimeError(f"{url}: no baseline measurement came out positive; retry")
    return statistics.median(tpots_ms)


def _latency_s(url: str, prompt: str, max_new_tokens: int) -> float:
    sampling = {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
    start = time.perf_counter()
    response = requests.post(
        f"{url}/generate", json={"text": prompt, "sampling_params": sampling},
        timeout=REQUEST_TIMEOUT_S,
    )  # fmt: skip
    response.raise_for_status()
    return time.perf_counter() - start


def server_info(url: str) -> dict:
    response = requests.get(f"{url}/server_info", timeout=INFO_TIMEOUT_S)
    response.raise_for_status()
    return response.json()


def adaspec_stats(info: dict) -> dict | None:
    """``internal_states[0].adaspec.stats`` (set by ``--spec-policy adaserve``), else None."""
    states = info.get("internal_states") or [{}]
    return (states[0].get("adaspec") or {}).get("stats")


def served_model(url: str) -> str:
    """The model name the OpenAI-compatible API expects."""
    response = requests.get(f"{url}/v1/models", timeout=INFO_TIMEOUT_S)
    response.raise_for_status()
    return response.json()["data"][0]["id"]
