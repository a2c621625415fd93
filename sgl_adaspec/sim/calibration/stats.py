"""What the calibration records per SLO class, and its JSON file.

Per output position the draft's top-w probabilities and the accepted rank; from them, per class:
binned outcomes (`Bins`) per child rank and for top-1 chain paths, the top-1 probability's
moments (`Moments`), accepted-chain histograms (`ClassAcceptance`). `stats_to_json` /
`stats_from_json` write and read the committed stats file, so the fit needs no models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

CLASSES = ("coding", "chat", "summarization")
WIDTH = 4  # draft top-w per position
CHAIN_CAP = 8  # chains / paths are evaluated up to this depth
# Draft-probability bins: fine near 0 (ranks 2..w) and near 1 (confident top-1 guesses).
BIN_EDGES = (
    0.0, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 1.0,
)  # fmt: skip


def bin_index(p: np.ndarray, edges: tuple[float, ...] = BIN_EDGES) -> np.ndarray:
    """Bin of each probability: edges[i] <= p < edges[i + 1]; p = 1 goes to the last bin."""
    p = np.asarray(p, dtype=np.float64)
    return np.clip(np.searchsorted(edges, p, side="right") - 1, 0, len(edges) - 2)


@dataclass
class Bins:
    """Outcomes (probability p, accepted 0/1) binned by p: count, accepted, sum of p, p^2, p*y."""

    FIELDS = ("count", "accepted", "sum_p", "sum_p2", "sum_py")

    count: np.ndarray
    accepted: np.ndarray
    sum_p: np.ndarray
    sum_p2: np.ndarray
    sum_py: np.ndarray

    @classmethod
    def empty(cls, num_bins: int = len(BIN_EDGES) - 1) -> Bins:
        return cls(*(np.zeros(num_bins) for _ in range(5)))

    def add(self, p: np.ndarray, accepted: np.ndarray) -> None:
        p = np.asarray(p, dtype=np.float64).ravel()
        y = np.asarray(accepted, dtype=np.float64).ravel()
        idx = bin_index(p)
        n = len(self.count)
        self.count += np.bincount(idx, minlength=n)
        self.accepted += np.bincount(idx, weights=y, minlength=n)
        self.sum_p += np.bincount(idx, weights=p, minlength=n)
        self.sum_p2 += np.bincount(idx, weights=p * p, minlength=n)
        self.sum_py += np.bincount(idx, weights=p * y, minlength=n)

    def __add__(self, other: Bins) -> Bins:
        return Bins(*(getattr(self, f) + getattr(other, f) for f in self.FIELDS))

    def points(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Non-empty bins: mean p, acceptance rate, count."""
        keep = self.count > 0
        n = self.count[keep]
        return self.sum_p[keep] / n, self.accepted[keep] / n, n

    def brier(self) -> float:
        """Mean (p - y)^2 over all outcomes (exact: y^2 = y)."""
        n = self.count.sum()
        return float((self.sum_p2.sum() - 2 * self.sum_py.sum() + self.accepted.sum()) / n)

    def ece(self, curve: tuple[np.ndarray, np.ndarray] | None = None) -> float:
        """Expected calibration error: count-weighted mean |rate - prediction| over bins; the
        prediction is the bin's mean p, or the curve (p, accept) at the bin's mean p."""
        mean_p, rate, n = self.points()
        pred = mean_p if curve is None else np.interp(mean_p, curve[0], curve[1])
        return float((n * np.abs(rate - pred)).sum() / n.sum())

    def to_json(self) -> dict:
        return {f: [_round(x) for x in getattr(self, f)] for f in self.FIELDS}

    @classmethod
    def from_json(cls, data: dict) -> Bins:
        return cls(*(np.array(data[f], dtype=np.float64) for f in cls.FIELDS))


@dataclass
class Moments:
    """Running count, mean and (population) variance."""

    count: int = 0
    mean: float = 0.0
    var: float = 0.0

    def add(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=np.float64).ravel()
        if values.size == 0:
            return
        self.merge(Moments(int(values.size), float(values.mean()), float(values.var())))

    def merge(self, other: Moments) -> None:
        n = self.count + other.count
        if n == 0:
            return
        delta = other.mean - self.mean
        mean = self.mean + delta * other.count / n
        m2 = self.var * self.count + other.var * other.count
        m2 += delta**2 * self.count * other.count / n
        self.count, self.mean, self.var = n, mean, m2 / n


def chain_depths(accepted_top1: np.ndarray, cap: int = CHAIN_CAP) -> np.ndarray:
    """For every position t with t + cap <= T: how many consecutive top-1 drafts from t on are
    accepted, capped at `cap` (the accept length of a depth-`cap` chain started at t)."""
    ok = np.asarray(accepted_top1, dtype=bool)
    run = np.zeros(len(ok) + 1, dtype=np.int64)
    for t in range(len(ok) - 1, -1, -1):
        run[t] = run[t + 1] + 1 if ok[t] else 0
    starts = max(len(ok) - cap + 1, 0)
    return np.minimum(run[:starts], cap)


def chain_paths(top1: np.ndarray, accepted_top1: np.ndarray, cap: int = CHAIN_CAP):
    """(depth, path probability f, accepted) of every top-1 chain path of depth 1..cap fully
    inside the output: f = product of the top-1 probabilities from t to t + depth - 1, accepted
    iff all those drafts are. Teacher forcing makes this exact: while the drafts are accepted the
    draft's context is the target's."""
    p = np.asarray(top1, dtype=np.float64)
    ok = np.asarray(accepted_top1, dtype=bool)
    depths, probs, accs = [], [], []
    for d in range(1, cap + 1):
        n = len(p) - d + 1
        if n <= 0:
            break
        windows_p = np.lib.stride_tricks.sliding_window_view(p, d)
        windows_ok = np.lib.stride_tricks.sliding_window_view(ok, d)
        depths.append(np.full(n, d))
        probs.append(windows_p.prod(axis=1))
        accs.append(windows_ok.all(axis=1))
    if not depths:
        return np.zeros(0, int), np.zeros(0), np.zeros(0, bool)
    return np.concatenate(depths), np.concatenate(probs), np.concatenate(accs)


@dataclass
class ClassAcceptance:
    """Everything recorded for one SLO class."""

    prompts: int = 0
    positions: int = 0
    top1: Moments = field(default_factory=Moments)
    rank_sum_p: np.ndarray = field(default_factory=lambda: np.zeros(WIDTH))
    node: list[Bins] = field(default_factory=lambda: [Bins.empty() for _ in range(WIDTH)])
    path: Bins = field(default_factory=Bins.empty)
    depth_sum_f: np.ndarray = field(default_factory=lambda: np.zeros(CHAIN_CAP))
    depth_accepted: np.ndarray = field(default_factory=lambda: np.zeros(CHAIN_CAP))
    depth_count: np.ndarray = field(default_factory=lambda: np.zeros(CHAIN_CAP))
    chain_hist: np.ndarray = field(default_factory=lambda: np.zeros(CHAIN_CAP + 1))

    def add(self, top_p: np.ndarray, rank: np.ndarray) -> None:
        """One output: top_p [T, w] the draft's top-w probabilities per position (descending),
        rank [T] the accepted child's rank (-1: none)."""
        top_p = np.asarray(top_p, dtype=np.float64).reshape(-1, WIDTH)
        rank = np.asarray(rank, dtype=np.int64)
        self.prompts += 1
        self.positions += len(rank)
        self.top1.add(top_p[:, 0])
        self.rank_sum_p += top_p.sum(axis=0)
        for k in range(WIDTH):
            self.node[k].add(top_p[:, k], rank == k)
        depth, f, ok = chain_paths(top_p[:, 0], rank == 0)
        self.path.add(f, ok)
        np.add.at(self.depth_sum_f, depth - 1, f)
        np.add.at(self.depth_accepted, depth - 1, ok)
        np.add.at(self.depth_count, depth - 1, 1)
        self.chain_hist += np.bincount(chain_depths(rank == 0), minlength=CHAIN_CAP + 1)

    def node_pooled(self) -> Bins:
        total = Bins.empty()
        for bins in self.node:
            total = total + bins
        return total

    def greedy_agreement(self) -> float:
        return float(self.node[0].accepted.sum() / max(self.positions, 1))

    def chain_accept_mean(self, depth: int) -> float:
        """Mean accepted drafts of a depth-`depth` chain (bonus not counted), from the histogram
        of min(run, CHAIN_CAP)."""
        lengths = np.minimum(np.arange(CHAIN_CAP + 1), depth)
        return float((self.chain_hist * lengths).sum() / max(self.chain_hist.sum(), 1))

    def to_json(self) -> dict:
        agree = [float(self.node[k].accepted.sum() / max(self.positions, 1)) for k in range(WIDTH)]
        return {
            "prompts": self.prompts,
            "positions": self.positions,
            "top1": {"count": self.top1.count, "mean": _round(self.top1.mean),
                     "var": _round(self.top1.var)},
            "rank_mean_p": [_round(x / max(self.positions, 1)) for x in self.rank_sum_p],
            "rank_accept": [_round(x) for x in agree],
            "node_bins": [bins.to_json() for bins in self.node],
            "path_bins": self.path.to_json(),
            "depth": {
                "count": [int(x) for x in self.depth_count],
                "sum_f": [_round(x) for x in self.depth_sum_f],
                "accepted": [int(x) for x in self.depth_accepted],
            },
            "chain_hist": [int(x) for x in self.chain_hist],
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: dict) -> ClassAcceptance:
        stats = cls()
        stats.prompts, stats.positions = int(data["prompts"]), int(data["positions"])
        t = data["top1"]
        stats.top1 = Moments(int(t["count"]), float(t["mean"]), float(t["var"]))
        stats.rank_sum_p = np.array(data["rank_mean_p"], float) * stats.positions
        stats.node = [Bins.from_json(b) for b in data["node_bins"]]
        stats.path = Bins.from_json(data["path_bins"])
        stats.depth_count = np.array(data["depth"]["count"], float)
        stats.depth_sum_f = np.array(data["depth"]["sum_f"], float)
        stats.depth_accepted = np.array(data["depth"]["accepted"], float)
        stats.chain_hist = np.array(data["chain_hist"], float)
        return stats


def _round(x: float) -> float:
    x = float(x)
    return x if x == 0 or not math.isfinite(x) else float(f"{x:.6g}")


def stats_to_json(classes: dict[str, ClassAcceptance], provenance: dict) -> dict:
    return {
        "format": "sgl_adaspec calibration stats v1",
        "provenance": provenance,
        "width": WIDTH,
        "chain_cap": CHAIN_CAP,
        "bin_edges": list(BIN_EDGES),
        "classes": {c: s.to_json() for c, s in classes.items()},
    }


def stats_from_json(data: dict) -> tuple[dict[str, ClassAcceptance], dict]:
    if tuple(data["bin_edges"]) != BIN_EDGES or data["width"] != WIDTH:
        raise ValueError("calibration stats were binned differently; re-aggregate from the cache")
    if data["chain_cap"] != CHAIN_CAP:
        raise ValueError("calibration stats use another chain cap; re-aggregate from the cache")
    return {c: ClassAcceptance.from_json(s) for c, s in data["classes"].items()}, data["provenance"]
