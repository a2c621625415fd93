"""Calibrated acceptance: the draft's path probability f is not the probability that the target
accepts a node, and the error differs by draft, target and workload (a draft can be over- or
under-confident, and differently at different f). Learned online from what verification
returns.

Each verified node is one trial: it succeeds when the target accepts the whole path to it
(the node lies on the request's accepted path). f' = g(f) with g the success rate of the
trials at that f, fitted as a non-decreasing function: the trials are binned by f (`edges`:
steps of 0.05 down to 0.05, geometric below), per bin the decayed trials, successes and sum of
f; each bin's rate is pulled toward its mean f times the draft's overall error (successes
over f, all bins, itself pulled toward 1 by `bias_prior` pseudo-successes) by `prior_weight`
pseudo-trials, so a bin with few trials follows the draft's general bias; pool-adjacent-
violators over the bins that have trials makes g non-decreasing; g is linear between those
bins' mean f, through (0, 0), and on to (1, the overall error) above the last (never below the
last bin's rate). Without trials g is the identity.

Why the pulls: one early verify of one request with a weak draft (32 nodes, f summing to 0.34,
none accepted) read an overall error of 0, so g was 0 at every f; no node was worth verifying
again, so no later verify could show otherwise (simulator, a100 rate 8, one seed in ten:
adaserve never speculated again and met 25 % of SLOs, where tetris met 85 %).

A non-decreasing g keeps f'(child) <= f'(parent) and the nodes' ranking, so selection stays
closed under parent. Counts decay exponentially per iteration so g follows a drifting
workload, and the sum of f' over the verified nodes tracks the accepted draft tokens
(AdaServe Theorem 3.1 with calibrated probabilities).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from sgl_adaspec.speculative.host_copy import to_device, to_dtype


def default_edges() -> tuple[float, ...]:
    """Bin edges over f, ascending: 0, a geometric ladder from 1e-6 to 0.05, then steps of
    0.05 to 1 (acceptance matters most, and varies most, at large f)."""
    low = [1e-6 * (0.05 / 1e-6) ** (i / 12) for i in range(12)]
    high = [round(0.05 * i, 2) for i in range(1, 21)]
    return (0.0, *low, *high)


@dataclass
class AcceptanceCalibration:
    """decay: weight kept by past iterations per new one (0.98: about the last 50 iterations);
    prior_weight: pseudo-trials per bin at the rate f says; bias_prior: pseudo accepted nodes
    (and as much f) in the draft's overall error; edges: the bins over f."""

    decay: float = 0.98
    prior_weight: float = 1.0
    bias_prior: float = 1.0
    edges: tuple[float, ...] = field(default_factory=default_edges)
    version: int = 0  # outcomes observed
    _trials: torch.Tensor = field(default=None, repr=False)  # [bins] decayed
    _successes: torch.Tensor = field(default=None, repr=False)  # [bins] decayed
    _f_sums: torch.Tensor = field(default=None, repr=False)  # [bins] decayed sums of f
    # (knots f [M], rates [M], per segment between two knots its line's value at 0 and slope
    # (the width kept off 0), left and right rate [M - 1, 4], the interior knots [M - 2]), read
    # by every `apply` until the next outcome.
    _fit: tuple | None = field(default=None, repr=False)
    # ((version, device), the fit's interior knots and segments there)
    _moved: tuple | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        edges = self.edges
        if (
            not 0 < self.decay <= 1
            or self.prior_weight <= 0
            or self.bias_prior <= 0
            or len(edges) < 2
            or edges[0] != 0
            or edges[-1] != 1
            or any(b <= a for a, b in itertools.pairwise(edges))
        ):
            raise ValueError(
                "AcceptanceCalibration needs 0 < decay <= 1, prior_weight > 0, bias_prior > 0 "
                f"and ascending edges from 0 to 1; got {self.decay}, {self.prior_weight}, "
                f"{self.bias_prior}, {edges}"
            )
        bins = len(edges) - 1
        self._edges = torch.tensor(edges[1:-1], dtype=torch.float64)  # inner edges
        self._trials = torch.zeros(bins, dtype=torch.float64)
        self._successes = torch.zeros(bins, dtype=torch.float64)
        self._f_sums = torch.zeros(bins, dtype=torch.float64)

    def observe(self, verified_f: torch.Tensor, accepted_nodes: torch.Tensor) -> None:
        """verified_f [B, N]: raw f of each request's verified draft nodes, 0 elsewhere;
        accepted_nodes [B, N] bool: the nodes on each request's accepted path."""
        f = verified_f.double().cpu().flatten()
        tried = f > 0
        f, hit = f[tried].clamp(max=1.0), accepted_nodes.cpu().flatten()[tried].double()
        index = torch.bucketize(f, self._edges, right=True)
        bins = self._trials.numel()
        self._trials = self.decay * self._trials + torch.bincount(index, minlength=bins)
        self._successes = self.decay * self._successes + torch.bincount(
            index, weights=hit, minlength=bins
        )
        self._f_sums = self.decay * self._f_sums + torch.bincount(index, weights=f, minlength=bins)
        self._fit = None
        self.version += 1

    def fit(self) -> tuple:
        """(f [M] ascending, g [M] non-decreasing, (0, 0) first: the bins with trials; the
        segments between them and the interior knots, as `apply` reads them)."""
        if self._fit is None:
            # A few dozen bins: in Python floats, not tensor ops (each op costs more than the
            # arithmetic, and the fit is remade after every outcome).
            all_trials = self._trials.tolist()
            seen = [i for i, t in enumerate(all_trials) if t > 1e-6]
            trials = [all_trials[i] for i in seen]
            f_sums, successes = self._f_sums.tolist(), self._successes.tolist()
            knots = [f_sums[i] / t for i, t in zip(seen, trials)]
            weight = [t + self.prior_weight for t in trials]
            # The prior: f scaled by how the draft errs overall (all bins' successes over their
            # f, pulled toward 1), so a bin with few trials follows the draft's general bias.
            scale = (float(self._successes.sum()) + self.bias_prior) / (
                float(self._f_sums.sum()) + self.bias_prior
            )
            prior = [min(k * scale, 1.0) for k in knots]
            rate = [
                (successes[i] + self.prior_weight * p) / w for i, p, w in zip(seen, prior, weight)
            ]
            if not seen:  # the identity
                knots, rate = [1.0], [1.0]
            else:
                rate = [min(max(r, 0.0), 1.0) for r in _non_decreasing(rate, weight)]
                if knots[-1] < 1.0:  # above the last bin seen: toward the overall error
                    knots.append(1.0)
                    rate.append(max(rate[-1], min(scale, 1.0)))
            knots = torch.tensor([0.0, *knots], dtype=torch.float64)
            rate = torch.tensor([0.0, *rate], dtype=torch.float64)
            slope = (rate[1:] - rate[:-1]) / (knots[1:] - knots[:-1]).clamp(min=1e-12)
            at_zero = rate[:-1] - slope * knots[:-1]
            segments = torch.stack((at_zero, slope, rate[:-1], rate[1:]), dim=1)
            # [K - 1, 4]: the line's value at 0 and slope, y0, y1 per segment; the interior
            # knots that pick one
            self._fit = (knots, rate, segments, knots[1:-1].contiguous())
        return self._fit

    def apply(self, path_prob: torch.Tensor) -> torch.Tensor:
        """Calibrated f' = g(f) (0 stays 0), same shape and dtype as `path_prob`. Non-decreasing
        in f as computed, rounding included (every step is monotone and a segment's value is
        held between its ends, the next one's start at most), so f' never exceeds a parent's
        where f did not."""
        return self.apply_exact(path_prob).to(path_prob.dtype)

    def apply_exact(self, path_prob: torch.Tensor) -> torch.Tensor:
        """`apply` in float64, whatever `path_prob`'s dtype."""
        inner_knots, segments = self._knots_on(path_prob.device)
        f = to_dtype(path_prob, torch.float64)
        # Interior knots below f: f in (k_i, k_i+1] lies in segment i, and f = 0 in the first
        # (f outside [0, 1] takes an end segment, whose ends hold it). A row lookup
        # (`embedding`) is the cheapest gather of a segment's terms.
        segment = torch.searchsorted(inner_knots, f)
        at_zero, slope, y0, y1 = torch.nn.functional.embedding(segment, segments).unbind(-1)
        # Held between the segment's ends (f = 0 stays 0): monotone across the segments as
        # computed.
        return torch.addcmul(at_zero, slope, f).clamp_(min=y0, max=y1)

    def _knots_on(self, device: torch.device) -> tuple:
        """The fit's interior knots and segments on `device`: the fit's own on the host (made
        with it, after an outcome), moved once per fit elsewhere (the fit is made on the host
        from outcomes; the draft's f stay where the draft wrote them)."""
        _, _, segments, inner_knots = self.fit()
        if device.type == "cpu":
            return inner_knots, segments
        if self._moved is None or self._moved[0] != (self.version, device):
            moved = tuple(to_device(t, device) for t in (inner_knots, segments))
            self._moved = ((self.version, device), moved)
        return self._moved[1]

    def calibrated_sum(self, verified_f: torch.Tensor) -> float:
        """Sum of f' over the nonzero entries of `verified_f` (what the calibration predicts)."""
        return float(self.apply(verified_f.double()).sum())

    def curve(
        self, points: tuple[float, ...] = (0.1, 0.3, 0.5, 0.7, 0.9)
    ) -> list[tuple[float, float]]:
        """(f, f') at `points`, for reports."""
        mapped = self.apply(torch.tensor(points, dtype=torch.float64)).tolist()
        return [(f, round(g, 4)) for f, g in zip(points, mapped)]


def _non_decreasing(values: list[float], weights: list[float]) -> list[float]:
    """Weighted least-squares non-decreasing fit (pool adjacent violators) of `values` [M]."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for value, weight in zip(values, weights):
        blocks.append([value, weight, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, c2 = blocks.pop()
            v1, w1, c1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    return [mean for mean, _, count in blocks for _ in range(count)]
