"""The open-loop replay against a stub streaming server (no SGLang): requests leave at their
arrival times while others are in flight, both APIs are timed and counted, HTTP errors count
as failed requests, and the SLO reaches the server in the right place for each API."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from aiohttp import web

from sgl_adaspec.bench.replay import ReplayTarget, SloSettings, replay
from sgl_adaspec.bench.server_probe import measure_baseline_tpot_ms
from sgl_adaspec.bench.workloads import Workload, WorkloadRequest
from sgl_adaspec.scheduler.request_slo import RequestSlo

TOKEN_DELAY_S = 0.02


class Stub:
    """Streams one token per TOKEN_DELAY_S; remembers when each request arrived and its SLO."""

    def __init__(self) -> None:
        self.received: list[tuple[float, str, dict | None]] = []

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        sampling = body["sampling_params"]
        self.received.append((time.perf_counter(), body["text"], sampling.get("custom_params")))
        if body["text"] == "fail":
            return web.json_response({"error": "bad request"}, status=400)
        n = sampling["max_new_tokens"]
        if not body.get("stream"):  # the baseline measurement's whole-request timing
            await asyncio.sleep(TOKEN_DELAY_S * n)
            return web.json_response({"text": "x" * n, "meta_info": {"completion_tokens": n}})
        response = web.StreamResponse()
        await response.prepare(request)
        for i in range(1, n + 1):
            await asyncio.sleep(TOKEN_DELAY_S)
            meta = {"completion_tokens": i}
            if i == n:
                meta |= {"spec_verify_ct": n // 2, "spec_accept_length": 2.0}
            chunk = {"text": "x" * i, "meta_info": meta}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append((time.perf_counter(), body["prompt"], body.get("custom_params")))
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(body["max_tokens"]):
            await asyncio.sleep(TOKEN_DELAY_S)
            chunk = {"choices": [{"index": 0, "text": "y"}], "usage": None}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"choices": [], "usage": {"completion_tokens": body["max_tokens"]}}
        await response.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        return response


@pytest.fixture(scope="module")
def stub():
    """(Stub, url) served on 127.0.0.1 from a thread with its own event loop."""
    state, loop, ready = Stub(), asyncio.new_event_loop(), threading.Event()
    app = web.Application()
    app.router.add_post("/generate", state.generate)
    app.router.add_post("/v1/completions", state.completions)
    runner = web.AppRunner(app)
    holder = {}

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        holder["port"] = site._server.sockets[0].getsockname()[1]
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    yield state, f"http://127.0.0.1:{holder['port']}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def workload(prompts_and_arrivals, tokens=10, slo=RequestSlo("chat", tpot_slo_ms=500.0)):
    requests = (
        WorkloadRequest(i, t, prompt, tokens, slo)
        for i, (prompt, t) in enumerate(prompts_and_arrivals)
    )
    return Workload("stub", tuple(requests))


def test_generate_replay_is_open_loop_and_timed(stub):
    state, url = stub
    state.received.clear()
    # Each request streams for at least 0.2 s (10 sleeps of 20 ms), longer than the 0.1 s
    # between arrivals: open loop means each leaves before the one before it has finished.
    run = replay(workload([("a", 0.0), ("b", 0.1), ("c", 0.2)]), ReplayTarget("stub", url),
                 SloSettings(), progress=False)  # fmt: skip
    assert [prompt for _, prompt, _ in state.received] == ["a", "b", "c"]
    assert [params for _, _, params in state.received] == [{"tpot_slo_ms": 500.0}] * 3
    assert all(r.completed and r.output_tokens == 10 and r.slo_met for r in run.records)
    streamed_ms = 1000 * TOKEN_DELAY_S * 10
    for earlier, later in zip(run.records, run.records[1:]):
        assert later.send_lag_ms >= 0.0
        # Both from the run's start: `later` left before `earlier` had its last token.
        later_sent_ms = 1000 * later.arrival_s + later.send_lag_ms
        assert later_sent_ms < 1000 * earlier.arrival_s + earlier.send_lag_ms + earlier.e2e_ms
    # What the stub's sleeps guarantee, whatever the host's speed.
    for r in run.records:
        assert r.ttft_ms >= 1000 * TOKEN_DELAY_S and r.e2e_ms >= streamed_ms
        assert r.spec_verify_ct == 5
    assert run.wall_s >= 0.2 + streamed_ms / 1000


def test_http_error_is_a_failed_request_not_a_crash(stub):
    _, url = stub
    run = replay(workload([("fail", 0.0), ("ok", 0.0)]), ReplayTarget("stub", url),
                 SloSettings(), progress=False)  # fmt: skip
    failed, ok = run.records
    assert not failed.completed and "HTTP 400" in failed.error and not failed.slo_met
    assert ok.completed and ok.slo_met


def test_completions_api_counts_usage_and_sends_top_level_custom_params(stub):
    state, url = stub
    state.received.clear()
    slo = RequestSlo("coding", baseline_multiple=2.0)
    run = replay(workload([("p", 0.0)], tokens=6, slo=slo),
                 ReplayTarget("stub", url, api="completions"),
                 SloSettings(baseline_tpot_ms=10.0), progress=False)  # fmt: skip
    (record,) = run.records
    assert record.completed and record.output_tokens == 6 and record.tpot_slo_ms == 20.0
    assert state.received[0][2] == {"tpot_slo_ms": 20.0}
    assert record.spec_verify_ct is None


def test_unknown_baseline_fails_before_any_request(stub):
    state, url = stub
    state.received.clear()
    relative = RequestSlo("coding", baseline_multiple=1.2)
    with pytest.raises(ValueError, match="baseline TPOT"):
        replay(workload([("p", 0.0)], slo=relative), ReplayTarget("stub", url), SloSettings(),
               progress=False)  # fmt: skip
    assert state.received == []


def test_baseline_tpot_is_the_per_token_latency_difference(stub):
    _, url = stub
    # T(n) - T(1) = (n - 1) token delays, whatever the fixed costs of a request.
    baseline_ms = measure_baseline_tpot_ms(url, ["a", "b", "c"], output_tokens=11)
    assert baseline_ms == pytest.approx(1000 * TOKEN_DELAY_S, rel=0.3)
