"""Admission order of waiting requests by urgency instead of arrival (SLO-aware scheduling).

A waiting request's *deadline* for its first token is arrival + its TTFT SLO, or arrival +
`max_wait_ms` when it states none. Its *slack* is deadline - now - estimated prefill time.
Order:
1. requests that have waited `max_wait_ms` or longer, oldest first (aging: no request, best
   effort included, waits much beyond that bound because of others' urgency);
2. then everyone else by slack, smallest first (the one that will miss its deadline soonest);
3. ties by arrival.
Pure: plain numbers in, an index order out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class AdmissionConfig:
    max_wait_ms: float = 2000.0
    # Estimated prefill cost per prompt token (ms), from the cost model; 0 ignores prompt length.
    prefill_ms_per_token: float = 0.0

    def __post_init__(self) -> None:
        if not self.max_wait_ms > 0:
            raise ValueError(f"max_wait_ms must be > 0, got {self.max_wait_ms}")
        if self.prefill_ms_per_token < 0:
            raise ValueError(f"prefill_ms_per_token must be >= 0, got {self.prefill_ms_per_token}")


@dataclass(frozen=True)
class WaitingRequest:
    arrival_s: float
    ttft_slo_ms: float | None
    prompt_tokens: int


def slack_ms(req: WaitingRequest, now_s: float, config: AdmissionConfig) -> float:
    budget_ms = req.ttft_slo_ms if req.ttft_slo_ms is not None else config.max_wait_ms
    deadline_s = req.arrival_s + budget_ms / 1000
    return 1000 * (deadline_s - now_s) - config.prefill_ms_per_token * req.prompt_tokens


def admission_order(
    waiting: Sequence[WaitingRequest], now_s: float, config: AdmissionConfig
) -> list[int]:
    """Indices of `waiting` in admission order (see the module docstring)."""

    def key(i: int):
        req = waiting[i]
        aged = 1000 * (now_s - req.arrival_s) >= config.max_wait_ms
        if aged:
            return (0, req.arrival_s, 0.0, i)
        return (1, slack_ms(req, now_s, config), req.arrival_s, i)

    return sorted(range(len(waiting)), key=key)
