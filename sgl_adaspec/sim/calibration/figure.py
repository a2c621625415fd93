"""The calibration figure: acceptance vs draft probability per class and rank with the fitted
curve, and each class's top-1 histogram with its fitted Beta (needs matplotlib; skipped
without it)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from sgl_adaspec.sim.acceptance import AcceptanceModel
from sgl_adaspec.sim.calibration.fit import MODEL_NAME
from sgl_adaspec.sim.calibration.stats import BIN_EDGES, WIDTH, ClassAcceptance


def plot(classes: dict[str, ClassAcceptance], model: AcceptanceModel, path: Path) -> bool:
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
