"""PNG figures of a bench (matplotlib, Agg backend: no display needed).

* ``load_sweep.png``: SLO attainment and goodput against the request rate, one line per server.
* ``per_class.png``: SLO attainment overall (``all``) and per class, one bar per server, one
  panel per request rate.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: render to files only
import matplotlib.pyplot as plt  # noqa: E402

from sgl_adaspec.bench.runner import BenchResult  # noqa: E402

DPI = 120
ALL = "all"  # the bar group of every request, before the per-class groups


def _labels(result: BenchResult) -> list[str]:
    return list(dict.fromkeys(run.label for run in result.runs if run.summary is not None))


def plot_load_sweep(result: BenchResult, path: Path) -> Path:
    fig, (ax_att, ax_good) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for label in _labels(result):
        points = sorted(
            (result.load_per_s(run) or 0.0, run.summary.overall)
            for run in result.runs
            if run.label == label and run.summary is not None
        )
        loads = [load for load, _ in points]
        ax_att.plot(loads, [g.attainment for _, g in points], marker="o", label=label)
        ax_good.plot(loads, [g.goodput_tokens_per_s for _, g in points], marker="o", label=label)
    ax_att.set(xlabel="request rate (req/s)", ylabel="SLO attainment", ylim=(-0.02, 1.02))
    ax_att.set_title("SLO attainment vs load")
    ax_good.set(xlabel="request rate (req/s)", ylabel="goodput (tokens/s)")
    ax_good.set_title("goodput vs load")
    for ax in (ax_att, ax_good):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.suptitle(result.workload)
    return _save(fig, path)


def plot_per_class(result: BenchResult, path: Path) -> Path:
    labels = _labels(result)
    loads = sorted({result.load_per_s(run) or 0.0 for run in result.runs if run.summary})
    classes = [ALL, *result.class_names]
    fig, axes = plt.subplots(
        1, max(1, len(loads)), figsize=(1.5 + 2.2 * max(1, len(classes)) * max(1, len(loads)), 4),
        squeeze=False, constrained_layout=True,
    )  # fmt: skip
    width = 0.8 / max(1, len(labels))
    for ax, load in zip(axes[0], loads):
        for k, label in enumerate(labels):
            run = next((r for r in result.runs if r.label == label and r.summary
                        and (result.load_per_s(r) or 0.0) == load), None)  # fmt: skip
            per_class = {ALL: run.summary.overall, **run.summary.per_class} if run else {}
            heights = [per_class[c].attainment if c in per_class else 0.0 for c in classes]
            xs = [i + (k - (len(labels) - 1) / 2) * width for i in range(len(classes))]
            ax.bar(xs, heights, width, label=label)
        ax.set_xticks(range(len(classes)), classes)
        ax.set(ylim=(0, 1.18), ylabel="SLO attainment", title=f"{load:.3g} req/s")
        ax.grid(axis="y", alpha=0.3)
    if labels:
        axes[0][0].legend(loc="upper center", ncol=len(labels), fontsize="small")
    fig.suptitle(f"{result.workload}: SLO attainment per class")
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
