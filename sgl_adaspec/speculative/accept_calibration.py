"""Calibrated acceptance: the draft's path probability f is not the probability that the target
accepts a node, and the error differs by draft, target and workload (a draft can be over- or
under-confident). Learned online from what verification returns.

The map is a power, f' = f ** gamma: monotone in f (it keeps f(child) <= f(parent) and the
nodes' ranking, so selection stays closed under parent) and it compounds along a path the way
per-step errors do: a draft that gives each step of an always-accepted chain probability 0.3
has f = 0.3 ** d at depth d, which no single factor maps to 1 at every depth, while gamma -> 0
does. gamma solves sum(f' over the verified nodes) = accepted draft tokens, both sides decayed
exponentially over iterations so it follows a drifting workload; the nodes are kept as a
histogram of log f (`bins` bins over [log_floor, 0], each with its nodes' mean log f).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


@dataclass
class AcceptanceCalibration:
    """decay: weight kept by past iterations per new one (0.98: about the last 50 iterations);
    prior_weight: pseudo-count of nodes at f = 1/e accepted as often as f says (gamma = 1), so
    a few early iterations cannot swing gamma far; gamma stays in [min_gamma, max_gamma]."""

    decay: float = 0.98
    prior_weight: float = 4.0
    min_gamma: float = 0.005
    max_gamma: float = 8.0
    bins: int = 48
    log_floor: float = -24.0
    observed_sum: float = 0.0
    version: int = 0  # outcomes observed
    _counts: torch.Tensor = field(default=None, repr=False)  # [bins] decayed node counts
    _log_sums: torch.Tensor = field(default=None, repr=False)  # [bins] decayed sums of log f
    _gamma: float | None = field(default=1.0, repr=False)  # None: refit before use

    def __post_init__(self) -> None:
        if (
            not 0 < self.decay <= 1
            or self.prior_weight <= 0
            or not 0 < self.min_gamma <= 1 <= self.max_gamma
            or self.bins < 2
            or self.log_floor >= 0
        ):
            raise ValueError(
                "AcceptanceCalibration needs 0 < decay <= 1, prior_weight > 0, "
                "0 < min_gamma <= 1 <= max_gamma, bins >= 2 and log_floor < 0; got "
                f"{self.decay}, {self.prior_weight}, {self.min_gamma}, {self.max_gamma}, "
                f"{self.bins}, {self.log_floor}"
            )
        self._counts = torch.zeros(self.bins, dtype=torch.float64)
        self._log_sums = torch.zeros(self.bins, dtype=torch.float64)

    def observe(self, verified_f: torch.Tensor, accepted: torch.Tensor) -> None:
        """verified_f [B, N]: raw f of each request's verified draft nodes, 0 elsewhere;
        accepted [B]: draft tokens each request accepted (accept length minus the bonus)."""
        f = verified_f.double().cpu().flatten()
        log_f = f[f > 0].log().clamp(min=self.log_floor, max=0.0)
        index = (-log_f / (-self.log_floor / self.bins)).long().clamp(max=self.bins - 1)
        self._counts = self.decay * self._counts + torch.bincount(index, minlength=self.bins)
        self._log_sums = self.decay * self._log_sums + torch.bincount(
            index, weights=log_f, minlength=self.bins
        )
        self.observed_sum = self.decay * self.observed_sum + float(accepted.clamp(min=0).sum())
        self._gamma = None
        self.version += 1

    @property
    def gamma(self) -> float:
        if self._gamma is None:
            self._gamma = self._fit()
        return self._gamma

    def _fit(self) -> float:
        """Bisection in log gamma: the sum of f ** gamma falls as gamma grows (f <= 1)."""
        nonzero = self._counts > 0
        counts = [*self._counts[nonzero].tolist(), self.prior_weight]
        mean_log_f = self._log_sums[nonzero] / self._counts[nonzero]
        log_f = [*mean_log_f.tolist(), -1.0]
        target = self.observed_sum + self.prior_weight * math.exp(-1.0)

        def predicted(gamma: float) -> float:
            return sum(c * math.exp(gamma * x) for c, x in zip(counts, log_f))

        lo, hi = math.log(self.min_gamma), math.log(self.max_gamma)
        for _ in range(40):
            mid = (lo + hi) / 2
            if predicted(math.exp(mid)) > target:
                lo = mid
            else:
                hi = mid
        return math.exp((lo + hi) / 2)

    def apply(self, path_prob: torch.Tensor) -> torch.Tensor:
        """Calibrated f' = f ** gamma (0 stays 0), same shape and dtype as `path_prob`."""
        return path_prob.clamp(min=0.0).pow(self.gamma).where(path_prob > 0, 0.0)

    def calibrated_sum(self, verified_f: torch.Tensor) -> float:
        """Sum of f' over the nonzero entries of `verified_f` (what the calibration predicts)."""
        return float(self.apply(verified_f.double()).sum())
