"""Verify cost versus verified tokens, and the token budget B chosen from it.

A target forward over k tokens costs about the same for small k (weights are read once, the
hardware is underused) and then grows with k once compute saturates: the roofline knee. Tokens
past the knee make every request's iteration slower; tokens before it are nearly free. AdaServe
sets its verify budget B at that knee.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VerifyCostProfile:
    """Measured verify-pass latency: tokens [K] ascending, latency_ms [K]."""

    tokens: tuple[int, ...]
    latency_ms: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.latency_ms) or len(self.tokens) < 2:
            raise ValueError("a cost profile needs >= 2 (tokens, latency) points of equal count")
        if list(self.tokens) != sorted(set(self.tokens)) or self.tokens[0] < 1:
            raise ValueError(f"profile token counts must be ascending and >= 1: {self.tokens}")
        if any(not latency > 0 for latency in self.latency_ms):
            raise ValueError(f"profile latencies must be > 0: {self.latency_ms}")

    def as_dict(self) -> dict:
        return {"tokens": list(self.tokens), "latency_ms": list(self.latency_ms)}


def knee_budget(profile: VerifyCostProfile) -> int:
    """The token count where cost starts to rise (Kneedle, for an increasing convex curve).

    Both axes are scaled to [0, 1]; the knee is the point farthest *below* the chord from the
    first to the last point (a flat-then-rising curve bends there). If no point lies below the
    chord the curve never bends upward: each extra token costs no more than the last, so the
    largest profiled count is the budget.
    """
    t0, t1 = profile.tokens[0], profile.tokens[-1]
    c0, c1 = profile.latency_ms[0], profile.latency_ms[-1]
    if c1 <= c0:
        return t1
    best, best_gap = t1, 0.0
    for tokens, latency in zip(profile.tokens, profile.latency_ms):
        x = (tokens - t0) / (t1 - t0)
        y = (latency - c0) / (c1 - c0)
        gap = x - y  # chord height at x minus the curve (chord is y = x after scaling)
        if gap > best_gap:
            best, best_gap = tokens, gap
    return best


def marginal_ms_per_token(profile: VerifyCostProfile) -> float:
    """Average extra latency per token across the profiled range (>= 0): the cost of adding
    prompt tokens to an iteration, as the scheduler's prefill bound uses it."""
    extra = profile.latency_ms[-1] - profile.latency_ms[0]
    return max(extra, 0.0) / (profile.tokens[-1] - profile.tokens[0])
