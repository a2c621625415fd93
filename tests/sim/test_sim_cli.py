"""`python -m sgl_adaspec.sim`: table, JSON, optional PNG, the peak ratio as the last line."""

from __future__ import annotations

import json
import math
import sys

import pytest

from sgl_adaspec.sim.__main__ import main, parse_args
from sgl_adaspec.sim.acceptance import DEFAULT, SYNTHETIC_DEFAULT
from sgl_adaspec.sim.experiments import PEAK_METRIC, SweepConfig, peak_ratio

SMALL = ["--rates", "3,6", "--num-requests", "30", "--repeats", "1"]


def test_defaults_come_from_the_config_dataclass():
    experiment, config = parse_args([])
    assert experiment == "rps-sweep" and config == SweepConfig()
    _, config = parse_args(["--rates", "1,2", "--policies", "none,adaserve"])
    assert config.rates_rps == (1.0, 2.0) and config.policies == ("none", "adaserve")


def test_bad_policy_is_a_usage_error():
    with pytest.raises(SystemExit):
        parse_args(["--policies", "eagle9"])


def test_rates_that_are_not_numbers_are_a_usage_error_naming_them(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--rates", "1,two"])
    assert "expected comma-separated numbers, got '1,two'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--policies", ","], "no policy given"),
        (["--max-running-requests", "0"], "max running requests must be >= 1, got 0"),
        (["--acceptance", "{missing}"], "no such file, nor one of qwen2.5-coder-1.5b+0.5b"),
        (["--acceptance", "{broken}"], "bad acceptance model"),
        (["--charge-decision-ms", "0.2"], "--charge-decision-ms needs --charge-critical-path"),
        (
            ["--charge-critical-path", "decide", "--charge-decision-ms", "-1"],
            "--charge-decision-ms must be finite and >= 0, got -1.0",
        ),
        (["--experiment", "trace"], "--experiment trace needs --trace PATH"),
        (["--experiment", "trace", "--trace", "{missing}"], "no such trace file"),
        (["--experiment", "trace", "--trace", "{broken}"], "line 1: invalid JSON"),
        (["--experiment", "trace", "--trace", "{csv}"], "cannot tell the trace format"),
        (
            ["--experiment", "trace", "--trace", "{csv}", "--trace-format", "azure"],
            "missing column",
        ),
    ],
)
def test_bad_inputs_are_one_usage_error_line_before_anything_runs(tmp_path, capsys, argv, message):
    files = {"missing": tmp_path / "missing.json", "broken": tmp_path / "broken.json",
             "csv": tmp_path / "trace.csv"}  # fmt: skip
    files["broken"].write_text('{"x": 1')
    files["csv"].write_text("a,b\n1,2\n")
    with pytest.raises(SystemExit) as exit_info:
        parse_args([arg.format(**files) for arg in argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_sweep_prints_table_writes_json_and_ends_with_the_ratio(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    assert main(SMALL + ["--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    # The default acceptance model is the calibrated one (measured on Qwen2.5-Coder 1.5B/0.5B).
    assert f"acceptance model: {DEFAULT.name}: measured" in "\n".join(lines)
    assert any("matplotlib is not installed" in line for line in lines)
    name, value = lines[-1].split("=")
    assert name == PEAK_METRIC
    sweep = json.loads((tmp_path / "rps_sweep.json").read_text())
    assert float(value) == pytest.approx(sweep[PEAK_METRIC], abs=1e-3)
    assert {(r["rate_rps"], r["policy"]) for r in sweep["rows"]} == {
        (rate, policy) for rate in (3.0, 6.0) for policy in SweepConfig().policies
    }
    assert not (tmp_path / "rps_sweep.png").exists()


def test_acceptance_by_name(tmp_path, capsys):
    assert main(SMALL + ["--policies", "static", "--acceptance", SYNTHETIC_DEFAULT.name,
                         "--out", str(tmp_path)]) == 0  # fmt: skip
    assert "acceptance model: synthetic-default: synthetic" in capsys.readouterr().out


def test_same_seed_same_table(tmp_path, capsys):
    main(SMALL + ["--policies", "static,adaserve", "--out", str(tmp_path / "a")])
    first = capsys.readouterr().out.splitlines()
    main(SMALL + ["--policies", "static,adaserve", "--out", str(tmp_path / "b")])
    second = capsys.readouterr().out.splitlines()
    table = [line for line in first if "|" in line]
    assert table and table == [line for line in second if "|" in line]
    assert first[-1] == second[-1]


def test_peak_ratio_edge_cases():
    rows = [
        {"rate_rps": 1.0, "policy": "static", "attainment": 0.5},
        {"rate_rps": 1.0, "policy": "adaserve", "attainment": 0.75},
    ]
    assert peak_ratio(rows, (1.0,)) == 1.5
    assert math.isnan(peak_ratio(rows[:1], (1.0,)))
    rows[0]["attainment"] = 0.0
    assert peak_ratio(rows, (1.0,)) == math.inf
