"""benchmarks/stand_downs.py: adaserve's loaded iterations by mode."""

import pytest

from tests.bench import load_benchmark


def test_every_loaded_iteration_is_counted_once_under_its_mode(capsys):
    argv = ["--preset", "a100x4-llama70b", "--rate", "8", "--seeds", "1", "--requests", "60",
            "--loaded", "1"]  # fmt: skip
    assert load_benchmark("stand_downs").main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    total = int(lines[1].rsplit(":", 1)[1])
    modes = {}
    for line in lines[2:]:
        if not line.startswith("  "):
            break
        name, count = line.strip().split(":")
        modes[name] = int(count.split()[0])
    assert total > 0 and sum(modes.values()) == total
    assert "planned" in modes  # a measured draft that pays: the plan runs
    share = float(lines[-1].removeprefix("adaserve_loaded_stand_down_share="))
    assert share == pytest.approx(modes.get("stand down", 0) / total, abs=1e-4)


def test_bad_counts_are_refused():
    with pytest.raises(SystemExit):
        load_benchmark("stand_downs").main(["--seeds", "0"])
