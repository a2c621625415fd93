"""Fit the simulator's `AcceptanceModel` to the recorded statistics.

Per class, Beta(alpha, beta) by moments of the draft's top-1 probability; one calibration curve
from the bins pooled over classes and ranks, made non-decreasing by pooling adjacent violators
(weighted by count), through (0, 0) and flat from the last bin's mean to p = 1.
"""

from __future__ import annotations

import numpy as np

from sgl_adaspec.sim.acceptance import AcceptanceModel, BetaParams
from sgl_adaspec.sim.calibration.stats import WIDTH, Bins, ClassAcceptance

MODEL_NAME = "qwen2.5-coder-1.5b+0.5b"


def beta_from_moments(mean: float, var: float) -> BetaParams:
    """Beta with the given mean and variance (method of moments). The variance must be below
    mean * (1 - mean), the Bernoulli limit."""
    if not 0.0 < mean < 1.0:
        raise ValueError(f"mean must be in (0, 1), got {mean}")
    limit = mean * (1.0 - mean)
    if not 0.0 < var < limit:
        raise ValueError(f"variance must be in (0, mean*(1-mean) = {limit:.4g}), got {var}")
    common = limit / var - 1.0
    return BetaParams(mean * common, (1.0 - mean) * common)


def isotonic(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Weighted least-squares non-decreasing fit (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [weighted mean, weight, length]
    for v, w in zip(np.asarray(values, float), np.asarray(weights, float)):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return np.concatenate([np.full(int(n), v) for v, _, n in blocks]) if blocks else np.array([])


def calibration_curve(bins: Bins) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Monotone curve P(accept | p) for AcceptanceModel: the isotonic fit at the bins' mean p,
    starting at (0, 0) and flat from the last bin's mean to p = 1."""
    mean_p, rate, n = bins.points()
    inside = (mean_p > 0.0) & (mean_p < 1.0)
    mean_p, rate, n = mean_p[inside], rate[inside], n[inside]
    fitted = isotonic(rate, n)
    xs = [0.0, *(float(x) for x in mean_p), 1.0]
    ys = [0.0, *(float(y) for y in fitted), float(fitted[-1]) if len(fitted) else 1.0]
    return tuple(xs), tuple(min(max(y, 0.0), 1.0) for y in ys)


def fit_model(classes: dict[str, ClassAcceptance], name: str, source: str) -> AcceptanceModel:
    top1 = {c: beta_from_moments(s.top1.mean, s.top1.var) for c, s in classes.items()}
    pooled = Bins.empty()
    for stats in classes.values():
        pooled = pooled + stats.node_pooled()
    xs, ys = calibration_curve(pooled)
    return AcceptanceModel(name=name, source=source, top1=top1, calibration_p=xs,
                           calibration_accept=ys)  # fmt: skip


def model_source(provenance: dict, classes: dict[str, ClassAcceptance]) -> str:
    # The text names this package by its former file, sim/calibration.py: it is part of the
    # committed model JSON, which `fit` must reproduce (tests/sim/test_calibration.py).
    counts = ", ".join(f"{c} {s.prompts} prompts / {s.positions} positions" for c, s in
                       classes.items())  # fmt: skip
    return (
        f"measured: draft {provenance['draft']['name']} vs target {provenance['target']['name']} "
        f"(Q4_K_M GGUFs run in {provenance['dtype']}), greedy target outputs teacher-forced "
        f"through the draft, top-{WIDTH} children per position ({counts}; "
        f"{provenance['date']}); Beta per class by moments of the top-1 probability, "
        "calibration pooled over classes and ranks, isotonic (sim/calibration.py)"
    )
