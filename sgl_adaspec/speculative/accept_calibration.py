"""Calibrated acceptance: the draft's path probability f is not the probability that the target
accepts a node, and the error differs by draft, target and workload (a draft can be over- or
under-confident). Learned online from what verification returns.

The map is one multiplicative factor, f' = min(c * f, 1): monotone (it keeps f(child) <= f(parent)
and the nodes' ranking), so selection stays closed under parent and only the cost rule sees the
change. c = (accepted draft tokens) / (sum of f over the verified nodes), both sums decayed
exponentially over iterations so c follows a drifting workload.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AcceptanceCalibration:
    """decay: weight kept by past iterations per new one (0.98: about the last 50 iterations);
    prior_weight: pseudo-count (in predicted tokens) of the prior c = 1, so a few early
    iterations cannot swing c far."""

    decay: float = 0.98
    prior_weight: float = 4.0
    max_scale: float = 4.0
    predicted_sum: float = 0.0
    observed_sum: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < self.decay <= 1 or self.prior_weight <= 0 or self.max_scale < 1:
            raise ValueError(
                f"AcceptanceCalibration needs 0 < decay <= 1, prior_weight > 0, max_scale >= 1; "
                f"got {self.decay}, {self.prior_weight}, {self.max_scale}"
            )

    def observe(self, predicted: torch.Tensor, observed: torch.Tensor) -> None:
        """predicted [B]: sum of raw f over each request's verified draft nodes; observed [B]:
        draft tokens it accepted (accept length minus the bonus token)."""
        self.predicted_sum = self.decay * self.predicted_sum + float(predicted.sum())
        self.observed_sum = self.decay * self.observed_sum + float(observed.clamp(min=0).sum())

    @property
    def scale(self) -> float:
        """c, between 1 / max_scale and max_scale."""
        c = (self.observed_sum + self.prior_weight) / (self.predicted_sum + self.prior_weight)
        return min(max(c, 1.0 / self.max_scale), self.max_scale)

    def apply(self, path_prob: torch.Tensor) -> torch.Tensor:
        """Calibrated f' = min(c f, 1), same shape and dtype as `path_prob`."""
        return (path_prob * self.scale).clamp(max=1.0)
