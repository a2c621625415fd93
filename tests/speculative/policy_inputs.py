"""Hand-built policy inputs for unit tests of the speculation policies."""

from __future__ import annotations

import math

import torch

from sgl_adaspec.scheduler.slo import SloBatch
from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.policies.base import IterationInput


def iteration_input(
    cands: Candidates,
    draft_depth: int,
    draft_width: int = 1,
    tpot_slo_ms: list[float] | None = None,
    context_len: int = 100,
    history: tuple[list[int], ...] | None = None,
) -> IterationInput:
    """Requests r0, r1, ... at their first decode step, each `context_len` tokens long, with
    the given TPOT SLOs (default: none, best effort)."""
    bsz = cands.num_requests
    tpot = [math.nan] * bsz if tpot_slo_ms is None else tpot_slo_ms
    slo = SloBatch(
        tpot_slo_ms=torch.tensor(tpot, dtype=torch.float64),
        decode_elapsed_ms=torch.zeros(bsz, dtype=torch.float64),
        tokens_out=torch.zeros(bsz, dtype=torch.float64),
    )
    return IterationInput(
        cands=cands,
        slo=slo,
        rids=tuple(f"r{i}" for i in range(bsz)),
        context_tokens=bsz * context_len,
        draft_depth=draft_depth,
        draft_width=draft_width,
        history=history,
    )
