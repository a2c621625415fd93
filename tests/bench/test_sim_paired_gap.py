"""benchmarks/sim_paired_gap.py: adaserve minus each other policy, seed by seed."""

import json

import pytest

from sgl_adaspec.sim.experiments import SweepConfig, run_rps_sweep

from tests.bench import load_benchmark


def load():
    return load_benchmark("sim_paired_gap")


def row(rate, policy, seeds):
    return {"rate_rps": rate, "policy": policy, "attainment_by_seed": seeds}


def test_the_gap_is_paired_by_seed():
    # Seeds 0.9 / 0.5 / 0.7 against 0.8 / 0.6 / 0.6: differences +10, -10, +10 points; the
    # means' difference is the same (+3.33), but one seed is behind and the error is 6.67.
    gaps = load().paired_gaps([
        row(8, "adaserve", [0.9, 0.5, 0.7]), row(8, "tetris", [0.8, 0.6, 0.6]),
        row(8, "none", [0.5, 0.5, 0.5]),
    ])  # fmt: skip
    tetris, none = gaps
    assert (tetris["policy"], tetris["seeds"], tetris["behind_seeds"]) == ("tetris", 3, 1)
    assert tetris["mean_points"] == pytest.approx(10 / 3)
    assert tetris["stderr_points"] == pytest.approx(20 / 3)  # stdev 11.55 / sqrt(3)
    assert none["mean_points"] == pytest.approx(20.0)
    assert none["stderr_points"] == pytest.approx(20 / 3**0.5)  # +40, 0, +20: stdev 20


def test_rows_without_adaserve_or_with_other_seeds_are_refused():
    bench = load()
    with pytest.raises(ValueError, match="no adaserve row at rate 4"):
        bench.paired_gaps([row(4, "tetris", [0.5])])
    with pytest.raises(ValueError, match="tetris ran 1 seeds"):
        bench.paired_gaps([row(4, "adaserve", [0.5, 0.6]), row(4, "tetris", [0.5])])


def test_a_real_sweep_reads_as_its_rows_say(tmp_path, capsys):
    bench = load()
    argv = ["--rates", "6", "--repeats", "2", "--num-requests", "40"]
    argv += ["--policies", "adaserve,static"]
    assert bench.main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    config = SweepConfig(
        rates_rps=(6.0,), repeats=2, num_requests=40, policies=("adaserve", "static")
    )
    rows = run_rps_sweep(config, progress=lambda line: None)["rows"]
    ours, theirs = (r["attainment_by_seed"] for r in rows)
    expected = sum(100 * (a - b) for a, b in zip(ours, theirs)) / 2
    name, value = lines[-1].split("=")
    assert name == "adaserve_min_paired_gap_points"
    assert float(value) == pytest.approx(expected, abs=0.01)
    assert any(line.startswith("| 6 | static | 2 |") for line in lines)
    # The same figures from the sweep's JSON, without running.
    sweep = tmp_path / "rps_sweep.json"
    sweep.write_text(json.dumps({"rows": rows}))
    assert bench.main(["--sweep", str(sweep)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == lines[-1]


def test_an_unknown_policy_is_refused_by_name(capsys):
    with pytest.raises(SystemExit) as exit_info:
        load().main(["--policies", "adaserve,nosuch"])
    assert exit_info.value.code == 2
    assert "unknown policies ['nosuch']" in capsys.readouterr().err
