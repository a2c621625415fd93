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
                predicted = self._predict_rows(coef, data[:, :-1])
                kept = latency <= STALL_FACTOR * predicted.clamp(min=1e-6)
                if not torch.equal(kept, typical):  # else the fit above is the one
                    coef = self._fit(data[kept])
            self._coef = coef
        return self._coef

    def _fit(self, data: torch.Tensor) -> torch.Tensor:
        """data [M, F + 1] (features, latency) -> [F + 1] slopes (clamped >= 0), intercept."""
        ridge = torch.full((self.num_features,), self.ridge, dtype=torch.float64)
        return ridge_fit(data[:, :-1].unsqueeze(0), data[:, -1], ridge)[0][0]

    def _predict_rows(self, coef: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """features [M, F] as observed -> [M] latencies under `coef`."""
        return features @ coef[:-1] + coef[-1]

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


# Candidate knees of `VerifyLatency`'s bend, in tokens: steps of sqrt(2). A bend is fitted
# only over MIN_BEND_POINTS distinct token counts (with fewer, any knee fits them, and a
# spurious one extrapolates wildly), and kept only where it cuts the squared error by BEND_GAIN.
KNEE_STEP = 2**0.5
MIN_BEND_POINTS = 5
BEND_GAIN = 0.2


@dataclass
class VerifyLatency(LinearLatency):
    """A forward's latency vs (tokens T, context tokens): w1 T + w2 log2 T + w3 max(T - knee, 0)
    + w4 context + intercept, all weights >= 0, the knee the one (of a grid in steps of
    sqrt(2) over the tokens seen) that fits best. The log term bends the curve down for few
    tokens: on a CPU a one-token forward runs at a fraction of an eight-token one's cost per
    token (SmolLM2 here: 76 ms at 1 token, 158 at 8, 338 at 64), and a line through passes of
    many tokens prices a few-token one ~2x. The knee bends it up: on a GPU a forward is flat
    (the weights' read) up to the knee, then linear (compute); a line through loaded passes
    priced the flat part 30-35 % low (the simulator's A100 70B model: 30 ms predicted as
    19-22 at 9-55 tokens), so speculation at light load was planned too cheap. Callers pass
    (T, context); with_context=False leaves the context out of the fit (the window then
    follows it as it drifts). `knee` is the fitted one (inf: no bend up)."""

    num_features: int = 2  # as observed: (T, context)
    with_context: bool = True
    _knee: float = field(default=math.inf, repr=False)

    @property
    def knee(self) -> float:
        self.coefficients()  # refit first where due
        return self._knee

    def _design(self, tokens, context, knee) -> torch.Tensor:
        """tokens, context (broadcastable), knee [C, 1, ..] or a number -> [.., P] features."""
        tokens = torch.as_tensor(tokens, dtype=torch.float64)
        columns = [tokens, tokens.clamp(min=1).log2(), (tokens - knee).clamp(min=0)]
        if self.with_context:
            columns.append(torch.as_tensor(context, dtype=torch.float64))
        return torch.stack(torch.broadcast_tensors(*columns), dim=-1)

    def _fit(self, data: torch.Tensor) -> torch.Tensor:
        tokens, context, latency = data[:, 0], data[:, 1], data[:, 2]
        knees = [math.inf]
        if tokens.unique().numel() >= MIN_BEND_POINTS:
            low, high = max(float(tokens.min()), 1.0), float(tokens.max())
            steps = int(math.log(high / low, KNEE_STEP))
            knees += [low * KNEE_STEP**i for i in range(1, steps + 1)]
        grid = torch.tensor(knees, dtype=torch.float64).view(-1, 1)  # [C, 1]
        design = self._design(tokens, context, grid)  # [C, M, P]
        # The bend's slope is hardly penalized: the T and bend columns are near-collinear, and
        # an equal penalty split the slope between them (a flat 30 ms read 25 below the knee).
        ridge = torch.full((design.shape[-1],), self.ridge, dtype=torch.float64)
        ridge[2] *= 1e-6
        coefs, sse = ridge_fit(design, latency, ridge)
        best = int(torch.argmin(sse))
        if sse[best] > (1.0 - BEND_GAIN) * sse[0]:  # a bend must earn its place
            best = 0
        self._knee = knees[best]
        return coefs[best]

    def _predict_rows(self, coef: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return self._design(features[:, 0], features[:, 1], self._knee) @ coef[:-1] + coef[-1]

    def predict(self, features: tuple[float, ...]) -> float | None:
        latency = self.predict_tensor(*map(float, features))
        return None if latency is None else float(latency)

    def predict_tensor(self, tokens, context) -> torch.Tensor | None:
        coef = self.coefficients()
        if coef is None:
            return None
        design = self._design(tokens, context, self._knee)
        return (design @ coef[:-1] + coef[-1]).clamp(min=0.0)

    def marginal_ms(self, tokens: float) -> float | None:
        """d latency / d T at T tokens: one more token's price there."""
        coef = self.coefficients()
        if coef is None:
            return None
        bend = coef[2] if tokens >= self._knee else 0.0
        return float(coef[0] + coef[1] / (max(tokens, 1.0) * math.log(2)) + bend)


def ridge_fit(
    x: torch.Tensor, y: torch.Tensor, ridge: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """C candidate designs x [C, M, P] of one latency y [M] -> each one's [C, P + 1] slopes
    (clamped >= 0; a small L2 penalty ridge [P] on them, per column scaled to at most 1,
    keeps near-identical points solvable) then intercept, and its squared error [C]."""
    count = y.shape[0]
    scale = x.abs().amax(dim=1, keepdim=True).clamp(min=1.0)  # [C, 1, P]: condition the system
    ones = torch.ones(*x.shape[:2], 1, dtype=torch.float64)
    xs = torch.cat([x / scale, ones], dim=2)  # [C, M, P + 1]
    penalty = torch.cat([ridge * count, torch.zeros(1, dtype=torch.float64)])
    gram = xs.transpose(1, 2) @ xs + torch.diag(penalty)
    rhs = xs.transpose(1, 2) @ y.view(1, -1, 1).expand(x.shape[0], -1, -1)
    coef = torch.linalg.lstsq(gram, rhs).solution.squeeze(2)  # [C, P + 1]
    slopes = (coef[:, :-1] / scale.squeeze(1)).clamp(min=0.0)
    # Refit the intercept for the clamped slopes so the mean is still matched.
    residual = y.unsqueeze(0) - (x @ slopes.unsqueeze(2)).squeeze(2)  # [C, M]
    intercept = residual.mean(dim=1, keepdim=True)
    sse = ((residual - intercept) ** 2).sum(dim=1)
    return torch.cat([slopes, intercept], dim=1), sse
