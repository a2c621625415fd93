"""`python -m sgl_adaspec.sim --experiment adaserve-grid`: the grid, its best point as server
flags, and the best attainment as the last line."""

from __future__ import annotations

import json

import pytest

from sgl_adaspec.sim.experiments import SweepConfig
from sgl_adaspec.sim.grid import GRID_METRIC, GridAxes, GridPoint, grid_points, run_grid


def test_grid_points_scale_the_knee_and_drop_duplicates():
    axes = GridAxes(budget_multipliers=(1.0, 1.01, 2.0), verify_multipliers=(1.0, 2.0),
                    draft_tokens=(16,))  # fmt: skip
    points = grid_points(100, axes)
    # 1.01 x 100 rounds to 101, a distinct budget; each budget gets B1 = B and 2B.
    assert points == [
        GridPoint(100, 100, 16), GridPoint(100, 200, 16), GridPoint(101, 101, 16),
        GridPoint(101, 202, 16), GridPoint(200, 200, 16), GridPoint(200, 400, 16),
    ]  # fmt: skip
    assert grid_points(1, GridAxes((1.0, 1.2), (1.0,), (8,))) == [GridPoint(1, 1, 8)]
    assert GridPoint(192, 192, 16).flags() == (
        "--adaserve-budget 192 --adaserve-verify-tokens-per-step 192 "
        "--adaserve-draft-tokens-per-step 16"
    )


def test_bad_axes_are_refused():
    with pytest.raises(ValueError, match="every grid axis"):
        GridAxes(draft_tokens=())
    with pytest.raises(ValueError, match="every grid axis"):
        GridAxes(budget_multipliers=(0.0,))


def test_grid_scores_every_point_and_picks_the_best():
    config = SweepConfig(rates_rps=(6.0,), num_requests=30, repeats=1)
    axes = GridAxes(budget_multipliers=(1.0, 2.0), verify_multipliers=(1.0,), draft_tokens=(64,))
    grid = run_grid(config, axes, progress=lambda _line: None)
    assert len(grid["rows"]) == 2
    best = max(grid["rows"], key=lambda r: (r["attainment"], r["goodput_tok_s"]))
    assert grid["best"] == best
    # The paper's defaults (B = knee, B1 = B, B2 = 64) are one of the points.
    assert grid["default"]["budget"] == grid["knee_budget"]
    for row in grid["rows"]:
        assert 0.0 <= row["attainment"] <= 1.0 and set(row["by_rate"]) == {6.0}


def test_cli_ends_with_the_best_attainment(tmp_path, capsys, monkeypatch):
    from sgl_adaspec.sim import grid as grid_module
    from sgl_adaspec.sim.__main__ import main

    small = GridAxes(budget_multipliers=(1.0,), verify_multipliers=(1.0, 2.0), draft_tokens=(64,))
    monkeypatch.setattr(grid_module.grid_main, "__defaults__", (small,))
    argv = ["--experiment", "adaserve-grid", "--rates", "6", "--num-requests", "30",
            "--repeats", "1", "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    name, value = lines[-1].split("=")
    saved = json.loads((tmp_path / "adaserve_grid.json").read_text())
    assert name == GRID_METRIC and float(value) == pytest.approx(saved["best"]["attainment"], abs=1e-3)
    assert any(line.startswith("best: --adaserve-budget") for line in lines)
