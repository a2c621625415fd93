"""`adaserve-grid`: tune adaserve's constants for one deployment in the simulator.

AdaServe finds the constants of its shape rules (eq. 8-9: B1, B2) by grid search; this
experiment does that search here, together with the verify budget B, on the sweep's workload
(same preset, acceptance model, SLO mix and seeds as `rps-sweep`) at the rates given. Grid:
B = knee x {budget multipliers}, B1 = B x {verify multipliers}, B2 in {draft tokens}; the score of
a point is its mean SLO attainment over the rates (goodput breaks ties). The best point is printed
as the server flags that apply it:

    --adaserve-budget B --adaserve-verify-tokens-per-step B1 --adaserve-draft-tokens-per-step B2

Last line: adaserve_grid_best_attainment=<mean attainment of the best point>.
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from sgl_adaspec.sim.experiments import SweepConfig, SweepSetup, mean_summary
from sgl_adaspec.sim.policies import adaserve_sim
from sgl_adaspec.speculative.adaserve.config import AdaserveConfig
from sgl_adaspec.speculative.adaserve.knee_shape import AdaptiveTreeConfig

GRID_METRIC = "adaserve_grid_best_attainment"


@dataclass(frozen=True)
class GridAxes:
    budget_multipliers: tuple[float, ...] = (1.0, 1.5, 2.0, 3.0)
    verify_multipliers: tuple[float, ...] = (1.0, 2.0, 3.0)
    draft_tokens: tuple[int, ...] = (16, 32, 64, 128)

    def __post_init__(self) -> None:
        axes = (self.budget_multipliers, self.verify_multipliers, self.draft_tokens)
        if not all(axes) or any(not v > 0 for axis in axes for v in axis):
            raise ValueError(f"every grid axis needs values > 0, got {asdict(self)}")


@dataclass(frozen=True)
class GridPoint:
    budget: int
    verify_tokens_per_step: int  # B1
    draft_tokens_per_step: int  # B2

    def flags(self) -> str:
        return (
            f"--adaserve-budget {self.budget} --adaserve-verify-tokens-per-step "
            f"{self.verify_tokens_per_step} --adaserve-draft-tokens-per-step "
            f"{self.draft_tokens_per_step}"
        )


def grid_points(knee: int, axes: GridAxes) -> list[GridPoint]:
    points = []
    for b, v, w in itertools.product(
        axes.budget_multipliers, axes.verify_multipliers, axes.draft_tokens
    ):
        budget = max(1, round(knee * b))
        points.append(GridPoint(budget, max(1, round(budget * v)), int(w)))
    return list(dict.fromkeys(points))  # multipliers may round to the same point


def run_grid(config: SweepConfig, axes: GridAxes, progress=print) -> dict:
    setup = SweepSetup.of(config)
    knee, baseline = setup.budget, setup.baseline
    workloads = {rate: setup.workloads(rate) for rate in config.rates_rps}
    rows = []
    for point in grid_points(knee, axes):
        adaserve = AdaserveConfig(
            budget=point.budget,
            baseline_tpot_ms=baseline,
            tree=AdaptiveTreeConfig(
                verify_tokens_per_step=point.verify_tokens_per_step,
                draft_tokens_per_step=point.draft_tokens_per_step,
            ),
        )
        by_rate = {}
        for rate, runs in workloads.items():
            mean = mean_summary(setup.run(lambda: adaserve_sim(adaserve), runs))
            by_rate[rate] = {k: mean[k] for k in ("attainment", "goodput_tok_s")}
        row = {
            **asdict(point),
            "attainment": float(np.mean([r["attainment"] for r in by_rate.values()])),
            "goodput_tok_s": float(np.mean([r["goodput_tok_s"] for r in by_rate.values()])),
            "by_rate": by_rate,
        }
        rows.append(row)
        progress(
            f"  B {point.budget:>4} B1 {point.verify_tokens_per_step:>4} "
            f"B2 {point.draft_tokens_per_step:>4}: attainment {row['attainment']:.3f} "
            f"goodput {row['goodput_tok_s']:.0f} tok/s"
        )
    best = max(rows, key=lambda r: (r["attainment"], r["goodput_tok_s"]))
    default = GridPoint(knee, knee, AdaptiveTreeConfig().draft_tokens_per_step)
    paper_default = next((r for r in rows if GridPoint(**_point(r)) == default), None)
    return {
        "experiment": "adaserve-grid",
        "config": asdict(config),
        "axes": asdict(axes),
        "knee_budget": knee,
        "rows": rows,
        "best": best,
        "default": paper_default,
    }


def _point(row: dict) -> dict:
    return {k: row[k] for k in ("budget", "verify_tokens_per_step", "draft_tokens_per_step")}


def grid_main(config: SweepConfig, axes: GridAxes = GridAxes()) -> dict:
    started = time.perf_counter()
    grid = run_grid(config, axes)
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "adaserve_grid.json"
    path.write_text(json.dumps(grid, indent=1, default=float) + "\n")
    rates = ", ".join(f"{r:g}" for r in config.rates_rps)
    best, default = grid["best"], grid["default"]
    if default is not None:
        print(
            f"defaults (B = knee = {grid['knee_budget']}, B1 = B, B2 = 64): mean attainment "
            f"{default['attainment']:.3f} at {rates} req/s"
        )
    print(
        f"best: {GridPoint(**_point(best)).flags()}: mean attainment {best['attainment']:.3f} "
        f"at {rates} req/s ({time.perf_counter() - started:.0f} s; wrote {path})"
    )
    print(f"{GRID_METRIC}={best['attainment']:.3f}")
    return grid
