"""benchmarks/decision_budget.py: how long adaserve's decision may take, with fixed charges."""

import pytest

from tests.bench import load_benchmark


def load():
    return load_benchmark("decision_budget")


def test_the_affordable_decision_is_the_longest_whose_shorter_ones_all_hold():
    affordable = load().affordable
    # 0.2 fails in one cell: 0.3 holding again does not count.
    assert affordable({0.1: [0.2, -0.1], 0.2: [-0.6, 0.0], 0.3: [0.1, 0.1]}) == 0.1
    assert affordable({0.3: [0.0], 0.1: [-0.4]}) == 0.3  # in order of the ms, not given order
    assert affordable({0.1: [-0.51]}) == 0.0


def test_a_fixed_charge_repeats_exactly_and_reports_the_gap(capsys):
    argv = ["--cells", "a100x4-llama70b:8", "--adaserve-ms", "0.1,2", "--seeds", "1",
            "--requests", "60"]  # fmt: skip
    bench = load()
    assert bench.main(argv) == 0
    first = capsys.readouterr().out
    assert bench.main(argv) == 0
    assert capsys.readouterr().out == first  # the host's clock plays no part
    lines = first.strip().splitlines()
    rows = [[c.strip() for c in line.split("|")] for line in lines[3:5]]
    assert [row[3] for row in rows] == ["0.1", "2"]
    for row in rows:
        assert float(row[6]) == pytest.approx(float(row[4]) - float(row[5]), abs=0.011)
    gaps = {float(row[3]): [float(row[6])] for row in rows}
    expected = bench.affordable(gaps)
    assert lines[-1] == f"adaserve_affordable_decision_ms={expected:g}"


def test_bad_decision_times_are_refused():
    with pytest.raises(SystemExit):
        load().main(["--adaserve-ms", "-0.1"])
