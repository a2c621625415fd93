"""How many prompt tokens one iteration may prefill without pushing tight running requests off
their TPOT track.

A prefill of k tokens runs in the same iteration as (or instead of) the running requests' decode
step and delays each of them by about k * prefill_ms_per_token. Running request r, with TPOT SLO
t_r, decode time l_r so far and o_r tokens out, stays on track through its next token while the
delay is at most its allowance t_r * (o_r + 1) - l_r. The prefill budget is the smallest
allowance over the running requests with an SLO, converted to tokens, never below
`min_tokens` (prefill must progress, or waiting requests would starve) and never above SGLang's
own chunk limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class RunningSlo:
    tpot_slo_ms: float | None
    decode_elapsed_ms: float
    tokens_out: int


def allowance_ms(r: RunningSlo) -> float:
    if r.tpot_slo_ms is None:
        return math.inf
    return r.tpot_slo_ms * (r.tokens_out + 1) - r.decode_elapsed_ms


def prefill_token_budget(
    running: Sequence[RunningSlo],
    prefill_ms_per_token: float,
    chunk_limit: int,
    min_tokens: int = 64,
) -> int:
    """Prompt tokens this iteration may prefill (see the module docstring)."""
    if prefill_ms_per_token <= 0 or not running:
        return chunk_limit
    tightest = min(allowance_ms(r) for r in running)
    if math.isinf(tightest):
        return chunk_limit
    affordable = int(max(tightest, 0.0) / prefill_ms_per_token)
    return max(min(affordable, chunk_limit), min(min_tokens, chunk_limit))
