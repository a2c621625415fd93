"""benchmarks/charged_bar.py: adaserve against tetris with the policies' time charged."""

import pytest

from tests.bench import load_benchmark


def load():
    return load_benchmark("charged_bar")


def test_each_policy_reads_the_median_of_its_runs():
    runs = [
        {(8.0, "adaserve"): 0.90, (8.0, "tetris"): 0.95},
        {(8.0, "adaserve"): 0.97, (8.0, "tetris"): 0.93},
        {(8.0, "adaserve"): 0.96, (8.0, "tetris"): 0.99},
    ]
    assert load().medians(runs, (8.0,)) == [(8.0, 0.96, 0.95)]


def test_cells_name_known_presets():
    bench = load()
    assert bench.parse_cells("a100x4-llama70b:8;h100-llama8b:16,48") == [
        ("a100x4-llama70b", (8.0,)), ("h100-llama8b", (16.0, 48.0)),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="unknown preset 'h900'"):
        bench.parse_cells("h900:8")


def test_a_charged_cell_prints_both_policies_and_the_worst_ratio(capsys):
    argv = ["--runs", "1", "--modes", "decide", "--scales", "1", "--repeats", "1",
            "--requests", "60", "--cells", "a100x4-llama70b:8"]  # fmt: skip
    assert load().main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    cell = [c.strip() for c in lines[3].split("|")]
    assert cell[1:5] == ["a100x4-llama70b", "8", "decide", "1"]
    ours, theirs, gap = float(cell[5]), float(cell[6]), float(cell[7])
    assert gap == pytest.approx(ours - theirs, abs=0.11)
    ratio = float(lines[-1].removeprefix("adaserve_over_tetris_charged_worst="))
    assert ratio == pytest.approx(ours / theirs, abs=2e-3)
    assert lines[-2].startswith("decide: adaserve within 0.5 point of tetris in ")
