"""Per-request latency records and what a replay reports from them. Pure: numbers in, numbers out.

Glossary (times measured by the client, from the moment the request was sent):

* TTFT: time to the first streamed token.
* mean TPOT: (last token time - first token time) / (output tokens - 1); undefined (None) for a
  request with fewer than 2 output tokens.
* SLO met: the request completed and its mean TPOT is at most its TPOT SLO. A request without an
  SLO, or with one output token (no TPOT to exceed), counts as met once completed; a request
  that failed or was aborted never does.
* SLO attainment: met / total, over every request of the group (failed ones included).
* goodput: output tokens of the requests that met their SLO / wall time of the whole run, in
  tokens/s; throughput counts every completed request's tokens the same way.
* accepted tokens per verify: output tokens / verify passes, summed over the completed requests
  that report verify passes (SGLang's ``meta_info.spec_verify_ct``; its ``spec_accept_length``
  per request), so the bonus token counts; None without speculation.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class RequestRecord:
    index: int
    slo_class: str
    tpot_slo_ms: float | None  # None: no SLO (best effort)
    arrival_s: float  # scheduled send time, seconds after the run started
    output_tokens: int
    ttft_ms: float | None = None
    decode_ms: float | None = None  # last token time - first token time
    e2e_ms: float | None = None  # send to end of the response
    error: str | None = None  # None: completed
    spec_verify_ct: int | None = None  # verify passes (meta_info), None when not reported
    input_tokens: int | None = None
    send_lag_ms: float | None = None  # how late the client sent it (open-loop health check)

    @property
    def completed(self) -> bool:
        return self.error is None

    @property
    def mean_tpot_ms(self) -> float | None:
        if not self.completed or self.output_tokens < 2 or self.decode_ms is None:
            return None
        return self.decode_ms / (self.output_tokens - 1)

    @property
    def slo_met(self) -> bool:
        if not self.completed:
            return False
        tpot = self.mean_tpot_ms
        return self.tpot_slo_ms is None or tpot is None or tpot <= self.tpot_slo_ms

    def as_dict(self) -> dict:
        return {**asdict(self), "mean_tpot_ms": self.mean_tpot_ms, "slo_met": self.slo_met}


@dataclass(frozen=True)
class GroupSummary:
    num_requests: int
    num_completed: int
    num_met: int
    attainment: float
    goodput_tokens_per_s: float
    throughput_tokens_per_s: float
    tpot_ms: dict[str, float | None]  # "p50", "p90", "p99" of mean TPOT over completed requests
    ttft_ms: dict[str, float | None]
    mean_e2e_ms: float | None
    accepted_tokens_per_verify: float | None

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class RunSummary:
    wall_s: float
    overall: GroupSummary
    per_class: dict[str, GroupSummary]

    def as_dict(self) -> dict:
        return {
            "wall_s": self.wall_s,
            "overall": self.overall.as_dict(),
            "per_class": {name: g.as_dict() for name, g in self.per_class.items()},
        }


def percentiles(values: list[float]) -> dict[str, float | None]:
    """Linear-interpolated percentiles (numpy's default); None for an empty list."""
    if not values:
        return {f"p{p}": None for p in PERCENTILES}
    return {f"p{p}": float(np.percentile(values, p)) for p in PERCENTILES}


def accepted_tokens_per_verify(records: list[RequestRecord]) -> float | None:
    counted = [r for r in records if r.completed and r.spec_verify_ct]
    if not counted:
        return None
    return sum(r.output_tokens for r in counted) / sum(r.spec_verify_ct for r in counted)


def summarize_group(records: list[RequestRecord], wall_s: float) -> GroupSummary:
    if not wall_s > 0:
        raise ValueError(f"wall_s must be > 0, got {wall_s}")
    completed = [r for r in records if r.completed]
    met = [r for r in records if r.slo_met]
    e2e = [r.e2e_ms for r in completed if r.e2e_ms is not None]
    return GroupSummary(
        num_requests=len(records),
        num_completed=len(completed),
        num_met=len(met),
        attainment=len(met) / len(records) if records else 0.0,
        goodput_tokens_per_s=sum(r.output_tokens for r in met) / wall_s,
        throughput_tokens_per_s=sum(r.output_tokens for r in completed) / wall_s,
        tpot_ms=percentiles([r.mean_tpot_ms for r in completed if r.mean_tpot_ms is not None]),
        ttft_ms=percentiles([r.ttft_ms for r in completed if r.ttft_ms is not None]),
        mean_e2e_ms=sum(e2e) / len(e2e) if e2e else None,
        accepted_tokens_per_verify=accepted_tokens_per_verify(records),
    )


def summarize(records: list[RequestRecord], wall_s: float) -> RunSummary:
    """Overall and per SLO class; every group's goodput uses the whole run's wall time."""
    classes = sorted({r.slo_class for r in records})
    return RunSummary(
        wall_s=wall_s,
        overall=summarize_group(records, wall_s),
        per_class={
            name: summarize_group([r for r in records if r.slo_class == name], wall_s)
            for name in classes
        },
    )
