"""One streamed request to an SGLang server with asyncio, timing every token chunk.

The concurrent counterpart of `sgl_adaspec.local_server.client.stream_generate` (which is
synchronous and sends one request at a time): an open-loop replay keeps many requests in flight
on one event loop. Two APIs:

* ``generate``: SGLang's native ``POST /generate``, SLO in ``sampling_params.custom_params``;
  every chunk carries ``meta_info.completion_tokens`` and the last one the speculation counters
  (``spec_verify_ct``, ``spec_accept_length``).
* ``completions``: OpenAI-compatible ``POST /v1/completions``, SLO as top-level
  ``custom_params``; the token count comes from the final ``usage`` chunk.

Both ask for exactly ``output_tokens`` tokens (greedy, ``ignore_eos``), as trace replays do.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal

import aiohttp

Api = Literal["generate", "completions"]
APIS: tuple[str, ...] = ("generate", "completions")
ERROR_BODY_CHARS = 300


@dataclass(frozen=True)
class StreamResult:
    """Client-side times (``time.perf_counter`` seconds) of one streamed request."""

    start_s: float
    end_s: float
    output_tokens: int
    first_token_s: float | None = None
    last_token_s: float | None = None
    meta_info: dict = field(default_factory=dict)
    error: str | None = None  # None: completed


def request_body(
    api: Api, prompt: str, output_tokens: int, custom_params: dict | None, model: str
) -> tuple[str, dict]:
    """(path, JSON body) of a greedy streamed request for exactly ``output_tokens`` tokens."""
    if api == "generate":
        sampling = {"temperature": 0.0, "max_new_tokens": output_tokens, "ignore_eos": True}
        if custom_params:
            sampling["custom_params"] = custom_params
        return "/generate", {"text": prompt, "stream": True, "sampling_params": sampling}
    if api == "completions":
        body = {
            "model": model,
            "prompt": prompt,
            "max_tokens": output_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if custom_params:
            body["custom_params"] = custom_params
        return "/v1/completions", body
    raise ValueError(f"unknown api {api!r}; choose one of: {', '.join(APIS)}")


async def sse_events(response: aiohttp.ClientResponse) -> AsyncIterator[dict]:
    """JSON payloads of ``data:`` lines until ``[DONE]``; chunks may split or join lines."""
    buffer = b""
    async for chunk in response.content.iter_any():
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[len(b"data:") :].strip()
            if data == b"[DONE]":
                return
            yield json.loads(data)


async def stream_request(
    session: aiohttp.ClientSession,
    url: str,
    api: Api,
    prompt: str,
    output_tokens: int,
    custom_params: dict | None = None,
    model: str = "default",
) -> StreamResult:
    """Send one request and time its tokens; failures come back as ``error``, never raised."""
    path, body = request_body(api, prompt, output_tokens, custom_params, model)
    start = time.perf_counter()
    tokens, first, last, meta = 0, None, None, {}
    try:
        async with session.post(url + path, json=body) as response:
            if response.status != 200:
                text = (await response.text())[:ERROR_BODY_CHARS]
                end = time.perf_counter()
                return StreamResult(start, end, 0, error=f"HTTP {response.status}: {text}")
            async for event in sse_events(response):
                now = time.perf_counter()
                if "error" in event:
                    raise RuntimeError(f"server error in stream: {event['error']}")
                count, exact = _token_count(api, event, tokens)
                if count > tokens and not exact:  # a chunk of text: tokens arrived now
                    first = now if first is None else first
                    last = now
                tokens = max(tokens, count)
                meta = event.get("meta_info", meta)
    except Exception as exc:  # timeouts, resets, bad JSON: the request failed, the replay goes on
        return StreamResult(start, time.perf_counter(), tokens, first, last, meta, _describe(exc))
    end = time.perf_counter()
    if first is None:
        return StreamResult(start, end, 0, meta_info=meta, error="the server streamed no tokens")
    return StreamResult(start, end, tokens, first, last, meta)


def _token_count(api: Api, event: dict, previous: int) -> tuple[int, bool]:
    """(tokens streamed so far, whether the event is only a count, not text)."""
    if api == "generate":
        return int(event.get("meta_info", {}).get("completion_tokens", previous)), False
    usage = event.get("usage")
    if not event.get("choices") and usage and "completion_tokens" in usage:
        return int(usage["completion_tokens"]), True  # the final usage chunk: the exact count
    # A text chunk carries at least one token; the usage chunk corrects the count at the end.
    return (previous + 1, False) if event.get("choices") else (previous, True)


def _describe(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"[:ERROR_BODY_CHARS] if str(exc) else type(exc).__name__
