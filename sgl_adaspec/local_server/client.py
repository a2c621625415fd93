"""Minimal HTTP client helpers for measuring a running SGLang server."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import requests


@dataclass(frozen=True)
class StreamTiming:
    """One streamed greedy generation. Decode rate excludes the prefill (time to first chunk)."""

    text: str
    completion_tokens: int
    ttft_s: float
    decode_tokens: int
    decode_s: float
    meta_info: dict

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else float("nan")


    @property
    def tpot_ms(self) -> float:
        """Mean time per output token after the first (the TPOT an SLO is stated in)."""
        return 1000 * self.decode_s / self.decode_tokens if self.decode_tokens else float("nan")


def stream_generate(
    url: str,
    text: str,
    max_new_tokens: int,
    custom_params: dict | None = None,
    timeout_s: float = 1800,
    ignore_eos: bool = False,
) -> StreamTiming:
    sampling = {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": ignore_eos}
    if custom_params is not None:
        sampling["custom_params"] = custom_params
    payload = {"text": text, "stream": True, "sampling_params": sampling}
    start = time.perf_counter()
    first_t = first_tokens = last_t = None
    last = {}
    with requests.post(f"{url}/generate", json=payload, stream=True, timeout=timeout_s) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                continue
            now = time.perf_counter()
            last = json.loads(line[len(b"data:") :])
            tokens = last["meta_info"]["completion_tokens"]
            if first_t is None:
                first_t, first_tokens = now, tokens
            last_t = now
    if first_t is None:
        raise RuntimeError("the server streamed no tokens")
    return StreamTiming(
        text=last["text"],
        completion_tokens=last["meta_info"]["completion_tokens"],
        ttft_s=first_t - start,
        decode_tokens=last["meta_info"]["completion_tokens"] - first_tokens,
        decode_s=last_t - first_t,
        meta_info=last["meta_info"],
    )


def generate(
    url: str,
    prompt: str,
    max_new_tokens: int,
    custom_params: dict | None = None,
    temperature: float = 0.0,
    ignore_eos: bool = False,
) -> dict:
    """One non-streaming `/generate` call; the response JSON (raises on an HTTP error)."""
    sampling = {"temperature": temperature, "max_new_tokens": max_new_tokens}
    if ignore_eos:  # a sampled request's length is then max_new_tokens, whatever it draws
        sampling["ignore_eos"] = True
    if custom_params is not None:
        sampling["custom_params"] = custom_params
    response = requests.post(
        f"{url}/generate", json={"text": prompt, "sampling_params": sampling}, timeout=300
    )
    response.raise_for_status()
    return response.json()
