"""adaserve's cost rule: how much to speculate, from what speculation returns and costs here.

Pure math (tensors in, numbers out). Dims: B requests, N candidate nodes per request, K the
curve's length. Terms as in `speculative/candidates.py`; f' is the calibrated path probability
(`accept_calibration`), so the expected accepted draft tokens of a set of nodes is their sum of
f' (AdaServe Theorem 3.1 with calibrated probabilities).

The objective is the batch's expected committed tokens per millisecond of the iteration:
    rate = (n + sum of f' over the verified draft nodes) / (draft ms + verify ms(tokens, context))
A plain decode commits n tokens in verify ms(n, context) + its own overhead. Every running
request pays the iteration's length, so a node is worth verifying only while it raises the
rate: greedy in descending f', a node with f' goes in while f' / (added ms) > rate so far. On
hardware where verifying one more token costs more than it returns, nothing goes in and (before
the draft) the plan is depth 0; where verification is nearly free, everything does.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import torch

# verify_ms(tokens, context) / draft_ms(steps, requests) -> float64 latency (broadcast); None
# if unknown.
LatencyFn = Callable[..., torch.Tensor | None]


@dataclass
class GainCurve:
    """curve [K + 1] float64: curve[k] = expected accepted draft tokens of a request's k best
    nodes by f' (curve[0] = 0), averaged over the requests of the last `drafts` drafts. Nodes
    ranked by f within a request form a prefix closed under parent (f of a child never exceeds
    its parent's), so the k best are a tree. The drafts are kept as raw f and the curve is
    rebuilt with the current calibration (`refresh`): a curve of calibrated values frozen at
    observation time would keep what an early, uncalibrated f said long after."""

    max_nodes: int = 64
    drafts: int = 8
    curve: torch.Tensor | None = field(default=None, repr=False)
    version: int = 0  # drafts observed
    _ranked: deque = field(default_factory=deque, repr=False)  # [B, <=K] raw f per draft

    @property
    def known(self) -> bool:
        return self.curve is not None or bool(self._ranked)

    def observe(self, path_prob: torch.Tensor, valid: torch.Tensor) -> None:
        """path_prob [B, N] raw f; valid [B, N] bool."""
        self.version += 1
        f = torch.where(valid, path_prob, 0.0).double().cpu()
        ranked = torch.sort(f, dim=1, descending=True).values[:, : self.max_nodes]
        pad = self.max_nodes - ranked.shape[1]  # fewer nodes: the curve is flat past them
        self._ranked.append(torch.nn.functional.pad(ranked, (0, pad)))
        while len(self._ranked) > self.drafts:
            self._ranked.popleft()

    def refresh(self, calibrate: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Rebuild `curve` from the kept drafts with `calibrate` (f -> f', monotone)."""
        if not self._ranked:
            return
        calibrated = calibrate(torch.cat(list(self._ranked)))  # [sum of B, K]
        zero = torch.zeros(1, dtype=torch.float64)
        self.curve = torch.cat([zero, calibrated.cumsum(1).mean(0)])


@dataclass(frozen=True)
class PlanChoice:
    """The plan for the next draft: depth (0: no speculation), the draft nodes per request it
    expects to verify, and the expected tokens per ms with it and with a plain decode."""

    depth: int
    nodes_per_request: int
    expected_accepted: float  # per request, bonus included
    tokens_per_ms: float
    plain_tokens_per_ms: float
    iteration_ms: float  # predicted, with the chosen (or best rejected) draft
    plain_ms: float  # predicted, without speculation

    def as_dict(self) -> dict:
        return {
            "depth": self.depth,
            "nodes_per_request": self.nodes_per_request,
            "expected_accepted_per_request": round(self.expected_accepted, 3),
            "tokens_per_ms": round(self.tokens_per_ms, 4),
            "plain_tokens_per_ms": round(self.plain_tokens_per_ms, 4),
            "iteration_ms": round(self.iteration_ms, 3),
            "plain_ms": round(self.plain_ms, 3),
            "speculate": self.depth > 0,
        }


def plan_depth(
    *,
    num_requests: int,
    context_tokens: int,
    max_depth: int,
    width: int,
    gain: GainCurve,
    verify_ms: LatencyFn,
    draft_ms: LatencyFn,
    plain_overhead_ms: float,
) -> PlanChoice | None:
    """Before the draft: the k (draft nodes per request) that maximizes the expected rate of a
    draft run to `max_depth`; depth 0 when a plain decode's rate is at least as high. None when
    a latency model has no observation yet.

    The draft always runs to `max_depth` when it runs: the gain curve is learned from the drafts
    that ran, and a shallower draft would show no gain past its own depth, so a depth chosen by
    the curve would only ever shrink."""
    n = num_requests
    k = torch.arange(0, min(max_depth * width, gain.max_nodes) + 1, dtype=torch.float64)  # [K]
    depth = torch.full_like(k, float(max_depth))
    verify = verify_ms(n * (1 + k), context_tokens)
    draft = draft_ms(depth, n)
    if verify is None or draft is None:
        return None
    plain_ms = float(verify[0]) + plain_overhead_ms
    plain_rate = n / max(plain_ms, 1e-9)
    expected = 1.0 + gain.curve[k.long()]  # [K] per request, bonus included
    rate = n * expected / (verify + draft).clamp(min=1e-9)  # [K]
    rate[0] = -1.0  # k = 0 with a draft is never better than a plain decode
    best = int(torch.argmax(rate))
    spec_ms = float(verify[best] + draft[best])
    if float(rate[best]) <= plain_rate:
        return PlanChoice(0, 0, float(expected[best]), float(rate[best]), plain_rate, spec_ms, plain_ms)
    return PlanChoice(
        int(depth[best]), best, float(expected[best]), float(rate[best]), plain_rate, spec_ms,
        plain_ms,
    )  # fmt: skip


def cost_budget(
    calibrated: torch.Tensor,
    valid: torch.Tensor,
    sunk_ms: float,
    context_tokens: int,
    verify_ms: LatencyFn,
) -> int | None:
    """After the draft (its `sunk_ms` already paid): the verify budget B, roots included, that
    maximizes expected committed tokens per ms over the batch-wide ranking by f'.
    calibrated [B, N] f'; valid [B, N] bool. None when the verify model has no observation."""
    n = calibrated.shape[0]
    f = torch.where(valid, calibrated, -1.0).double().flatten().cpu()
    ranked = torch.sort(f, descending=True).values
    ranked = ranked[ranked >= 0]  # [M] valid nodes, best first
    m = torch.arange(0, ranked.numel() + 1, dtype=torch.float64)  # [M + 1]
    expected = n + torch.cat([torch.zeros(1, dtype=torch.float64), ranked.cumsum(0)])
    verify = verify_ms(n + m, context_tokens)
    if verify is None:
        return None
    rate = expected / (sunk_ms + verify).clamp(min=1e-9)
    return n + int(torch.argmax(rate))  # argmax: the first (smallest) best prefix
