"""Online linear latency model: latency_ms ~ w . features + intercept, fitted by least squares
over a sliding window of observations (AdaSpec eq. 2's form, T = alpha N_c + gamma N_b + delta).

Seeded from a start-up profile and refitted as the server runs, so the model tracks the
hardware it runs on. Until two distinct observations exist the prediction is the mean latency.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar

import torch

# An observation this many times the median of those held is a stall, not a cost.
STALL_FACTOR = 10.0
# An observation larger than any held (in a size feature) that the fit misses by more than this
# share refits at the next read (`LinearLatency.observe`).
SURPRISE = 0.25


@dataclass
class LinearLatency:
    """num_features: length of each feature tuple; window: observations kept; ridge: small L2
    penalty (on the slopes, not the intercept) so a window of near-identical points stays
    solvable. Slopes are clamped at >= 0: more tokens never make a forward pass faster.
    refit_fraction: a fit is reused until the observations since it reach this fraction of
    those held (at least one), so a server observing every iteration refits every 16th
    iteration once the window is full: a fit costs about a millisecond on a CPU, which a
    plain decode of a small model cannot afford each iteration. Except after a surprise: an
    observation beyond every one held in a size feature (`size_features`), which the fit
    extrapolated to and missed by more than `SURPRISE`: a line through small passes can
    price a large one at half its cost, and every plan until the refit would trust it.

    `version` counts fits, so a caller can reuse what it derived from the last one;
    `surprises` counts surprises, so a caller can drop what it derived from a fit one proved
    wrong."""

    # Whether the slopes left are fitted again when one is held at 0 (`_fit_many`).
    refit_held_slopes: ClassVar[bool] = True

    num_features: int
    window: int = 256
    ridge: float = 1e-3
    refit_fraction: float = 1 / 16
    version: int = 0
    _rows: deque = field(default_factory=deque, repr=False)
    _coef: torch.Tensor | None = field(default=None, repr=False)
    # The same coefficients as floats: the predictions run on every plan and selection, and
    # a 0-d tensor per coefficient cost a tensor op each time it was read.
    _coef_values: list[float] | None = field(default=None, repr=False)
    _unfitted: int = field(default=0, repr=False)  # observations since the last fit
    surprises: int = 0
    # Per size feature, the largest value held (None: none held since the window last turned).
    _largest: list | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.num_features < 1 or self.window < 2:
            raise ValueError("LinearLatency needs num_features >= 1 and window >= 2")
        self._rows = deque(maxlen=self.window)

    @property
    def size_features(self) -> tuple[int, ...]:
        """Indices of the features that grow with a pass's size (every feature here)."""
        return tuple(range(self.num_features))

    def observe(self, features: tuple[float, ...], latency_ms: float) -> None:
        if len(features) != self.num_features:
            raise ValueError(f"expected {self.num_features} features, got {len(features)}")
        row = (*map(float, features), float(latency_ms))
        if self._is_surprise(row):
            self.surprises += 1
            self._unfitted = self.window  # refit at the next read
        if len(self._rows) == self.window and self._largest is not None:
            leaving = self._rows[0]
            if any(leaving[i] >= m for m, i in zip(self._largest, self.size_features)):
                self._largest = None  # a largest leaves the window: recounted when asked
        self._rows.append(row)
        self._unfitted += 1
        if self._largest is not None:
            self._largest = [max(m, row[i]) for m, i in zip(self._largest, self.size_features)]

    def _is_surprise(self, row: tuple[float, ...]) -> bool:
        """Whether `row` lies beyond every observation held in a size feature and the last fit
        missed it by more than SURPRISE."""
        if self._coef is None or len(self._rows) < 3:
            return False
        if self._largest is None:
            self._largest = [max(r[i] for r in self._rows) for i in self.size_features]
        if all(row[i] <= m for m, i in zip(self._largest, self.size_features)):
            return False
        x = torch.tensor([row[:-1]], dtype=torch.float64)
        predicted = float(self._predict_rows(x, self._coef)[0])
        return predicted > 0 and abs(row[-1] / predicted - 1.0) > SURPRISE

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

    def last_fit(self) -> list[float] | None:
        """The coefficients of the last fit, without refitting (None before one)."""
        return None if self._coef is None else [round(c, 4) for c in self._coef.tolist()]

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
                predicted = self._predict_rows(data[:, :-1], coef)
                kept = latency <= STALL_FACTOR * predicted.clamp(min=1e-6)
                if not torch.equal(kept, typical):  # else the fit above is the one
                    coef = self._fit(data[kept])
            self._coef, self._coef_values = coef, coef.tolist()
        return self._coef

    def _predict_rows(self, x: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
        """x [..., M, F] observed features, coef [..., F + 1] as `coefficients` (one fit per
        leading index) -> [..., M] latencies."""
        return (x @ coef[..., :-1].unsqueeze(-1)).squeeze(-1) + coef[..., -1:]

    def _fit(self, data: torch.Tensor) -> torch.Tensor:
        """data [M, F + 1] (features, latency) -> [F + 1] slopes (clamped >= 0), intercept."""
        return self._fit_many(data[:, :-1], data[:, -1])

    def _fit_many(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """x [..., M, F] features (one fit per leading index), y [M] latencies -> [..., F + 1]
        slopes (>= 0), intercept. A slope the least-squares fit makes negative is held at 0
        and, where `refit_held_slopes`, the others are fitted again without it (an active set,
        at most F rounds): held at 0 without that refit, the other slopes keep what they had
        taken on against it (a negative rows slope, clamped alone, left a steep per-step slope
        and a negative intercept that priced short drafts far too cheap)."""
        scale = x.abs().amax(dim=-2, keepdim=True).clamp(min=1.0)  # [..., 1, F]: conditioning
        ones = torch.ones_like(x[..., :1])
        xs = torch.cat([x / scale, ones], dim=-1)  # [..., M, F + 1]
        penalty = torch.full((self.num_features + 1,), self.ridge, dtype=torch.float64)
        penalty[-1] = 0.0
        rhs = y.unsqueeze(-1)
        free = torch.ones_like(xs[..., :1, :], dtype=torch.bool)  # [..., 1, F + 1]
        rounds = self.num_features + 1 if self.refit_held_slopes else 1
        for _ in range(rounds):
            # A held feature's column reads 0, so the ridge holds its weight at 0.
            held = xs * free
            gram = held.mT @ held + torch.diag(penalty) * len(y)
            coef = torch.linalg.lstsq(gram, held.mT @ rhs).solution.squeeze(-1)
            negative = torch.nn.functional.pad(coef[..., :-1] < 0, (0, 1)).unsqueeze(-2)
            if not bool(negative.any()):
                break
            free = free & ~negative
        slopes = (coef[..., :-1] / scale.squeeze(-2)).clamp(min=0.0)
        # Refit the intercept for the clamped slopes so the mean is still matched.
        intercept = (y - (x @ slopes.unsqueeze(-1)).squeeze(-1)).mean(dim=-1)
        return torch.cat([slopes, intercept.unsqueeze(-1)], dim=-1)

    def predict_tensor(self, *features: torch.Tensor | float) -> torch.Tensor | None:
        """`predict` for many points at once: one broadcastable tensor (or number) per feature;
        float64 latencies of the broadcast shape (None before any observation)."""
        if self.coefficients() is None:
            return None
        coef = self._coef_values
        terms = (c * torch.as_tensor(x, dtype=torch.float64) for c, x in zip(coef, features))
        latency = coef[-1] + sum(terms)
        return torch.as_tensor(latency, dtype=torch.float64).clamp(min=0.0)

    def predict(self, features: tuple[float, ...]) -> float | None:
        coef = self.coefficients()
        if coef is None:
            return None
        x = torch.tensor([*map(float, features), 1.0], dtype=torch.float64)
        return max(float(x @ coef), 0.0)


# Knees the verify fit tries: a ratio of 2^(1/4) apart, as a forward's cost is read in tokens.
KNEE_STEP = 2**0.25
# A knee is kept only where it leaves at most this share of the squared error without one.
KNEE_GAIN = 0.8
# ... and only where the fit without one leaves more than this share of the latencies' spread.
KNEE_RESIDUAL = 0.01


@dataclass
class VerifyLatency(LinearLatency):
    """A forward's latency vs (tokens T, context tokens): w1 max(T, knee) + w2 log2 T + w3
    context + intercept, all weights >= 0. The log term lets the fit bend down: on a CPU a
    one-token forward costs a fraction of an eight-token one per token, and a line through
    passes of many tokens prices a few-token one ~2x. The knee lets it bend up: on a GPU a
    forward is flat (memory-bound) up to the knee, then linear (compute-bound), and a line
    through both prices a pass below the knee far too cheap, so the plan drafts too shallow
    under load. The knee is the one of a grid that fits best, kept where the fit without one
    (knee 1) misses (`KNEE_RESIDUAL`) and the knee cuts its squared error by a fifth
    (`KNEE_GAIN`). Callers pass (T, context); with_context=False leaves the context out of
    the fit (the window then follows it as it drifts)."""

    # A GPU's convex cost often draws a negative log-term slope; clamped alone, it leaves a
    # token slope steeper than least squares (big verifies dearer, small ones cheaper). Yet
    # refitting the other slopes lowered SLO attainment (not studied further), so verify fits
    # keep the clamp.
    refit_held_slopes: ClassVar[bool] = False

    num_features: int = 3
    with_context: bool = True
    knee: float = 1.0  # of the last fit

    def __post_init__(self) -> None:
        self.num_features = 3 if self.with_context else 2
        super().__post_init__()

    @property
    def size_features(self) -> tuple[int, ...]:
        return (0,)  # the tokens (the context grows with every iteration: no surprise)

    def _features(self, tokens, context) -> tuple:
        log_tokens = math.log2(max(tokens, 1))
        return (tokens, log_tokens, context) if self.with_context else (tokens, log_tokens)

    def _fit(self, data: torch.Tensor) -> torch.Tensor:
        """The fit of the knee (from a grid within the tokens observed, and 1) with the least
        squared error; sets `knee`."""
        x, y = data[:, :-1], data[:, -1]
        tokens = x[:, 0]
        low, high = float(tokens.min()), float(tokens.max())
        steps = math.ceil(math.log(max(high, 1.0), KNEE_STEP))
        grid = KNEE_STEP ** torch.arange(1, max(steps, 1), dtype=torch.float64)
        knees = torch.cat([torch.ones(1, dtype=torch.float64), grid[(grid > low) & (grid < high)]])
        bent = x.expand(len(knees), *x.shape).clone()  # [K, M, F]
        bent[..., 0] = torch.maximum(tokens, knees.unsqueeze(1))
        coef = self._fit_many(bent, y)  # [K, F + 1]
        predicted = super()._predict_rows(bent, coef)  # [K, M]: the features already bent
        error = ((predicted - y) ** 2).sum(dim=1)  # [K]
        best = int(error.argmin())  # the first (lowest) of ties
        spread = float(((y - y.mean()) ** 2).sum())
        if error[best] > KNEE_GAIN * error[0] or error[0] <= KNEE_RESIDUAL * spread:
            # A knee is one more parameter: on a few points of a line (or of noise) some knee
            # always fits a little better and bends the prediction where no bend is.
            best = 0
        self.knee = float(knees[best])
        return coef[best]

    def _predict_rows(self, x: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
        bent = x.clone()
        bent[:, 0] = x[:, 0].clamp(min=self.knee)
        return super()._predict_rows(bent, coef)

    def observe(self, features: tuple[float, ...], latency_ms: float) -> None:
        super().observe(self._features(*features), latency_ms)

    def predict(self, features: tuple[float, ...]) -> float | None:
        coef = self.coefficients()  # fit first: it sets the knee
        if coef is None:
            return None
        tokens, *rest = self._features(*features)
        return super().predict((max(tokens, self.knee), *rest))

    def predict_tensor(self, tokens, context) -> torch.Tensor | None:
        if self.coefficients() is None:
            return None
        tokens = torch.as_tensor(tokens, dtype=torch.float64)
        log_tokens = tokens.clamp(min=1).log2()
        bent = tokens.clamp(min=self.knee)
        if not self.with_context:
            return super().predict_tensor(bent, log_tokens)
        return super().predict_tensor(bent, log_tokens, context)

    def tokens_curve(self, tokens: torch.Tensor) -> TokensCurve | None:
        """`predict_tensor(tokens, context)` at a context given later (`TokensCurve.at`, bit
        for bit the same): the tokens' terms now, e.g. planned while the device works, the
        context's then (None before any observation)."""
        if self.coefficients() is None:
            return None
        tokens = torch.as_tensor(tokens, dtype=torch.float64)
        coef = self._coef_values
        terms = (tokens.clamp(min=self.knee), tokens.clamp(min=1).log2())
        per_context = coef[2] if self.with_context else None
        return TokensCurve(sum(c * t for c, t in zip(coef, terms)), per_context, coef[-1])

    def marginal_ms(self, tokens: float) -> float | None:
        """d latency / d T at T tokens: one more token's price there."""
        coef = self.coefficients()
        if coef is None:
            return None
        linear = float(coef[0]) if tokens >= self.knee else 0.0
        return linear + float(coef[1] / (max(tokens, 1.0) * math.log(2)))


@dataclass(frozen=True)
class TokensCurve:
    """A verify's predicted ms over token counts [T] (`VerifyLatency.tokens_curve`), but for
    the context's term: tokens_terms [T] float64, the context's weight (None: not fitted on
    it), the intercept."""

    tokens_terms: torch.Tensor
    per_context: float | None
    intercept: float

    def at(self, context_tokens: float) -> torch.Tensor:
        """[T] float64 ms at `context_tokens`."""
        terms = self.tokens_terms
        if self.per_context is not None:
            terms = terms + self.per_context * float(context_tokens)
        return (self.intercept + terms).clamp(min=0.0)
