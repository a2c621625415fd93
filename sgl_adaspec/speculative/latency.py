"""Online linear latency model: latency_ms ~ w . features + intercept, fitted by least squares
over a sliding window of observations (AdaSpec eq. 2's form, T = alpha N_c + gamma N_b + delta).

Seeded from a start-up profile and refitted as the server runs, so the model tracks the
hardware it runs on. Until two distinct observations exist the prediction is the mean latency.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import torch

# An observation this many times the median of those held is a stall, not a cost.
STALL_FACTOR = 10.0


@dataclass
class LinearLatency:
    """num_features: length of each feature tuple; window: observations kept; ridge: small L2
    penalty (on the slopes, not the intercept) so a window of near-identical points stays
    solvable. Slopes are clamped at >= 0: more tokens never make a forward pass faster.
    refit_fraction: a fit is reused until the observations since it reach this fraction of
    those held (at least one), so a server observing every iteration refits every 16th
    iteration once the window is full: a fit costs about a millisecond on a CPU, which a
    plain decode of a small model cannot afford each iteration.

    `version` counts fits, so a caller can reuse what it derived from the last one."""

    num_features: int
    window: int = 256
    ridge: float = 1e-3
    refit_fraction: float = 1 / 16
    version: int = 0
    _rows: deque = field(default_factory=deque, repr=False)
    _coef: torch.Tensor | None = field(default=None, repr=False)
    _unfitted: int = field(default=0, repr=False)  # observations since the last fit

    def __post_init__(self) -> None:
        if self.num_features < 1 or self.window < 2:
            raise ValueError("LinearLatency needs num_features >= 1 and window >= 2")
        self._rows = deque(maxlen=self.window)

    def observe(self, features: tuple[float, ...], latency_ms: float) -> None:
        if len(features) != self.num_features:
            raise ValueError(f"expected {self.num_features} features, got {len(features)}")
        self._rows.append((*map(float, features), float(latency_ms)))
        self._unfitted += 1

    def seed(self, points: list[tuple[tuple[float, ...], float]]) -> None:
        for features, latency in points:
            self.observe(features, latency)

    @property
    def num_observations(self) -> int:
        return len(self._rows)

    def feature_values(self, index: int) -> list[float]:
        """Feature `index` of every observation held."""
        return [row[index] for row in self._rows]

    def min_latency(self) -> float | None:
        """The lowest latency observed among those held (None before any)."""
        return min((row[-1] for row in self._rows), default=None)

    def coefficients(self) -> torch.Tensor | None:
        """[num_features + 1] float64: slopes then intercept (None before any observation)."""
        if not self._rows:
            return None
        if self._coef is None or self._unfitted >= max(1, self.refit_fraction * len(self._rows)):
            self._unfitted = 0
            self.version += 1
            data = torch.tensor(list(self._rows), dtype=torch.float64)  # [M, F + 1]
            # A server's first iterations (lazy set-up) or one stalled by the host can take 100x
            # a normal one and would own a mean for long: a point over STALL_FACTOR times what
            # a fit without the points that far over the median predicts for it is left out
            # (a legitimately large batch is predicted large and stays).
            latency = data[:, -1]
            typical = latency <= STALL_FACTOR * latency.median()
            if len(data) < 3:  # too few to tell a stall from a cost
                typical = torch.ones_like(typical)
            coef = self._fit(data[typical])
            if len(data) >= 3:
                predicted = data[:, :-1] @ coef[:-1] + coef[-1]
                kept = latency <= STALL_FACTOR * predicted.clamp(min=1e-6)
                if not torch.equal(kept, typical):  # else the fit above is the one
                    coef = self._fit(data[kept])
            self._coef = coef
        return self._coef

    def _fit(self, data: torch.Tensor) -> torch.Tensor:
        """data [M, F + 1] (features, latency) -> [F + 1] slopes (clamped >= 0), intercept."""
        x, y = data[:, :-1], data[:, -1]
        scale = x.abs().amax(dim=0).clamp(min=1.0)  # [F]: condition the normal equations
        xs = torch.cat([x / scale, torch.ones_like(y).unsqueeze(1)], dim=1)  # [M, F + 1]
        penalty = torch.full((self.num_features + 1,), self.ridge, dtype=torch.float64)
        penalty[-1] = 0.0
        gram = xs.T @ xs + torch.diag(penalty) * len(y)
        coef = torch.linalg.lstsq(gram, xs.T @ y.unsqueeze(1)).solution.squeeze(1)
        slopes = (coef[:-1] / scale).clamp(min=0.0)
        # Refit the intercept for the clamped slopes so the mean is still matched.
        intercept = (y - x @ slopes).mean()
        return torch.cat([slopes, intercept.unsqueeze(0)])

    def predict_tensor(self, *features: torch.Tensor | float) -> torch.Tensor | None:
        """`predict` for many points at once: one broadcastable tensor (or number) per feature;
        float64 latencies of the broadcast shape (None before any observation)."""
        coef = self.coefficients()
        if coef is None:
            return None
        terms = (c * torch.as_tensor(x, dtype=torch.float64) for c, x in zip(coef, features))
        latency = coef[-1] + sum(terms)
        return torch.as_tensor(latency, dtype=torch.float64).clamp(min=0.0)

    def predict(self, features: tuple[float, ...]) -> float | None:
        coef = self.coefficients()
        if coef is None:
            return None
        x = torch.tensor([*map(float, features), 1.0], dtype=torch.float64)
        return max(float(x @ coef), 0.0)


@dataclass
class VerifyLatency(LinearLatency):
    """A forward's latency vs (tokens T, context tokens): w1 T + w2 log2 T + w3 context +
    intercept, all weights >= 0. The log term lets the fit bend: on a CPU a one-token forward
    runs at a fraction of an eight-token one's cost per token (SmolLM2 here: 76 ms at 1 token,
    158 at 8, 338 at 64), and a line through passes of many tokens prices a few-token one ~2x.
    On a GPU, flat then linear, w2 is ~0. Callers pass (T, context); with_context=False leaves
    the context out of the fit (the window then follows it as it drifts)."""

    num_features: int = 3
    with_context: bool = True

    def __post_init__(self) -> None:
        self.num_features = 3 if self.with_context else 2
        super().__post_init__()

    def _features(self, tokens, context) -> tuple:
        log_tokens = math.log2(max(tokens, 1))
        return (tokens, log_tokens, context) if self.with_context else (tokens, log_tokens)

    def observe(self, features: tuple[float, ...], latency_ms: float) -> None:
        super().observe(self._features(*features), latency_ms)

    def predict(self, features: tuple[float, ...]) -> float | None:
        return super().predict(self._features(*features))

    def predict_tensor(self, tokens, context) -> torch.Tensor | None:
        tokens = torch.as_tensor(tokens, dtype=torch.float64)
        log_tokens = tokens.clamp(min=1).log2()
        if not self.with_context:
            return super().predict_tensor(tokens, log_tokens)
        return super().predict_tensor(tokens, log_tokens, context)

    def marginal_ms(self, tokens: float) -> float | None:
        """d latency / d T at T tokens: one more token's price there."""
        coef = self.coefficients()
        if coef is None:
            return None
        return float(coef[0] + coef[1] / (max(tokens, 1.0) * math.log(2)))
