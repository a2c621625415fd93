"""Open-loop replay of a workload against one server: every request leaves at its arrival time,
whatever is still in flight, and its tokens are timed as they stream back.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Literal

import aiohttp
from tqdm import tqdm

from sgl_adaspec.bench.http_stream import Api, StreamResult, stream_request
from sgl_adaspec.bench.metrics import RequestRecord
from sgl_adaspec.bench.workloads import Workload, WorkloadRequest
from sgl_adaspec.scheduler.request_slo import CUSTOM_CLASS, RequestSlo

SloField = Literal["tpot_slo_ms", "slo_class"]
SLO_FIELDS: tuple[str, ...] = ("tpot_slo_ms", "slo_class")


@dataclass(frozen=True)
class SloSettings:
    """How a request's SLO becomes a TPOT target (ms) and what the client sends for it.

    target = the class's TPOT (absolute, or ``baseline_multiple * baseline_tpot_ms``) times
    ``slo_scale``. ``tpot_slo_ms`` sends that target; ``slo_class`` sends the class name and lets
    the server resolve it (only with scale 1: the server knows no scale).
    """

    slo_scale: float = 1.0
    baseline_tpot_ms: float | None = None
    send: SloField = "tpot_slo_ms"
    # Per class: a TTFT SLO (ms) sent as custom_params.ttft_slo_ms (SLO-aware admission reads it).
    ttft_slo_ms: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        for name, ms in self.ttft_slo_ms:
            if not ms > 0:
                raise ValueError(f"TTFT SLO of class {name!r} must be > 0 ms, got {ms}")
        if not self.slo_scale > 0:
            raise ValueError(f"slo_scale must be > 0, got {self.slo_scale}")
        if self.baseline_tpot_ms is not None and not self.baseline_tpot_ms > 0:
            raise ValueError(f"baseline_tpot_ms must be > 0, got {self.baseline_tpot_ms}")
        if self.send not in SLO_FIELDS:
            raise ValueError(f"unknown SLO field {self.send!r}; choose one of {SLO_FIELDS}")
        if self.send == "slo_class" and self.slo_scale != 1.0:
            raise ValueError("sending slo_class needs slo_scale 1 (the server applies no scale)")

    def target_ms(self, slo: RequestSlo) -> float | None:
        if slo.baseline_multiple is not None and self.baseline_tpot_ms is None:
            raise ValueError(
                f"class {slo.slo_class!r} is relative to the baseline TPOT, which is not known"
            )
        target = slo.resolve_ms(self.baseline_tpot_ms)
        return None if target is None else target * self.slo_scale

    def custom_params(self, slo: RequestSlo) -> dict | None:
        params: dict = {}
        ttft = dict(self.ttft_slo_ms).get(slo.slo_class)
        if ttft is not None:
            params["ttft_slo_ms"] = ttft
        target = self.target_ms(slo)
        if target is None:
            return params or None
        if self.send == "slo_class" and slo.slo_class != CUSTOM_CLASS:
            return {**params, "slo_class": slo.slo_class}
        return {**params, "tpot_slo_ms": round(target, 3)}


@dataclass(frozen=True)
class ReplayTarget:
    label: str
    url: str
    api: Api = "generate"
    model: str = "default"  # the OpenAI API's model name


@dataclass(frozen=True)
class ReplayRun:
    records: tuple[RequestRecord, ...]
    wall_s: float  # run start (first scheduled send) to the end of the last response


def replay(
    workload: Workload,
    target: ReplayTarget,
    slo: SloSettings,
    timeout_s: float = 600.0,
    progress: bool = True,
) -> ReplayRun:
    return asyncio.run(_replay(workload, target, slo, timeout_s, progress))


async def _replay(
    workload: Workload, target: ReplayTarget, slo: SloSettings, timeout_s: float, progress: bool
) -> ReplayRun:
    for request in workload.requests:
        slo.target_ms(request.slo)  # a relative SLO without a baseline fails before any traffic
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    connector = aiohttp.TCPConnector(limit=0)  # open loop: no client-side cap on concurrency
    bar = tqdm(
        total=len(workload.requests), desc=target.label, unit="req", disable=not progress,
        leave=False,
    )  # fmt: skip
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        start_s = time.perf_counter()

        async def one(request: WorkloadRequest) -> StreamResult:
            await asyncio.sleep(max(0.0, start_s + request.arrival_s - time.perf_counter()))
            result = await stream_request(
                session, target.url, target.api, request.prompt, request.output_tokens,
                slo.custom_params(request.slo), target.model,
            )  # fmt: skip
            bar.update(1)
            return result

        try:
            results = await asyncio.gather(*(one(r) for r in workload.requests))
        finally:
            bar.close()
    records = tuple(
        to_record(request, result, slo.target_ms(request.slo), start_s)
        for request, result in zip(workload.requests, results)
    )
    wall_s = max(result.end_s for result in results) - start_s
    return ReplayRun(records, wall_s)


def to_record(
    request: WorkloadRequest, result: StreamResult, tpot_slo_ms: float | None, run_start_s: float
) -> RequestRecord:
    def ms(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else 1000 * (b - a)

    verify_ct = result.meta_info.get("spec_verify_ct")
    return RequestRecord(
        index=request.index,
        slo_class=request.slo.slo_class,
        tpot_slo_ms=tpot_slo_ms,
        arrival_s=request.arrival_s,
        output_tokens=result.output_tokens,
        ttft_ms=ms(result.start_s, result.first_token_s),
        decode_ms=ms(result.first_token_s, result.last_token_s),
        e2e_ms=ms(result.start_s, result.end_s),
        error=result.error,
        spec_verify_ct=int(verify_ct) if verify_ct is not None else None,
        input_tokens=request.input_tokens,
        send_lag_ms=ms(run_start_s + request.arrival_s, result.start_s),
    )
