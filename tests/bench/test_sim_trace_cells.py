"""benchmarks/sim_trace_cells.py: every (compression, coding scale) cell of the traces in a folder,
the worst gap last, and a second run resumes from the cells already written."""

import json
from pathlib import Path

import numpy as np
import pytest

from tests.bench import load_benchmark


def load():
    return load_benchmark("sim_trace_cells")


def small_trace(path: Path) -> None:
    rng = np.random.default_rng(1)
    entries = [
        {
            "emission_time_ms": float(t), "prompt": "x", "input_length": 100,
            "output_length": 30, "slo_ratio": float(rng.choice([1.2, -50.0, -150.0])),
        }
        for t in np.cumsum(rng.exponential(300.0, 30))
    ]  # fmt: skip
    path.write_text(json.dumps(entries))


def test_every_cell_runs_once_and_the_worst_gap_is_the_last_line(tmp_path, capsys, monkeypatch):
    bench = load()
    small_trace(tmp_path / "adaserve_rps1.0_ol256.json")
    out = tmp_path / "cells.json"
    argv = [
        "--trace-dir", str(tmp_path), "--compressions", "2", "--coding-scales", "1.0,0.6",
        "--policies", "none,adaserve", "--out", str(out),
    ]  # fmt: skip
    assert bench.main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    cells = json.loads(out.read_text())
    assert len(cells) == 2
    gaps = [cell["adaserve_minus_best_other_attainment_points"] for cell in cells.values()]
    for cell in cells.values():
        ours, other = (row["attainment"] for row in reversed(cell["rows"]))
        assert cell["adaserve_minus_best_other_attainment_points"] == pytest.approx(
            100 * (ours - other)
        )
    name, value = lines[-1].split("=")
    assert name == "adaserve_min_gap_to_best_other_points"
    assert float(value) == pytest.approx(min(gaps), abs=0.01)
    assert sum(line.startswith("| rps1.0 | 2 |") for line in lines) == 2

    def no_rerun(*args, **kwargs):
        raise AssertionError("a cell already written ran again")

    monkeypatch.setattr(bench, "run_trace", no_rerun)
    assert bench.main(argv) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == lines[-1]


def test_a_folder_without_adaserve_traces_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        load().main(["--trace-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "no AdaServe trace" in capsys.readouterr().err
