"""The simulator replays trace files: arrivals compressed, SLOs and lengths from the trace."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from sgl_adaspec.bench.traces import TraceRow
from sgl_adaspec.scheduler.slo_config import DEFAULT_SLO_CONFIG, load_slo_config
from sgl_adaspec.sim import __main__ as sim_cli
from sgl_adaspec.sim.trace_replay import mean_rate_rps, trace_workload
from sgl_adaspec.sim.workload import DEFAULT_CLASSES

SLO_CONFIG = load_slo_config(DEFAULT_SLO_CONFIG)
BASELINE_MS = 40.0


def adaserve_rows() -> list[TraceRow]:
    # AdaServe's three classes: coding (1.2 x baseline), chat (50 ms), summarization (150 ms).
    return [
        TraceRow(0.0, 100, 256, "p", 1.2),
        TraceRow(1.0, 200, 128, "p", -50.0),
        TraceRow(3.0, 900, 64, "p", -150.0),
        TraceRow(4.0, 120, 1, "p", 1.2),
    ]


def test_adaserve_slos_classes_lengths_and_compression():
    workload = trace_workload(adaserve_rows(), SLO_CONFIG, BASELINE_MS, time_compression=2.0)
    assert workload.class_names == ("coding", "chat", "summarization")
    np.testing.assert_allclose(workload.arrival_s, [0.0, 0.5, 1.5, 2.0])
    np.testing.assert_allclose(workload.tpot_slo_ms, [1.2 * BASELINE_MS, 50.0, 150.0, 48.0])
    assert workload.class_index.tolist() == [0, 1, 2, 0]
    assert workload.prompt_tokens.tolist() == [100, 200, 900, 120]
    assert workload.output_tokens.tolist() == [256, 128, 64, 2]  # one decoded token at least
    assert mean_rate_rps(workload) == pytest.approx(3 / 2.0)


def test_relative_slo_scale_moves_only_the_relative_class():
    workload = trace_workload(adaserve_rows(), SLO_CONFIG, BASELINE_MS, relative_slo_scale=0.6)
    np.testing.assert_allclose(workload.tpot_slo_ms, [24.0, 50.0, 150.0, 24.0])


def test_rows_without_slo_draw_classes_and_missing_lengths():
    rows = [TraceRow(float(t)) for t in range(400)]  # timestamps only
    workload = trace_workload(rows, SLO_CONFIG, BASELINE_MS, seed=3)
    shares = {cls.name: cls.share for cls in DEFAULT_CLASSES}
    for i, name in enumerate(workload.class_names):
        picked = workload.class_index == i
        assert abs(picked.mean() - shares[name]) < 0.08
        cls = next(c for c in DEFAULT_CLASSES if c.name == name)
        assert workload.output_tokens[picked].min() >= max(2, cls.output.low)
        assert workload.prompt_tokens[picked].max() <= cls.prompt.high
        expected = SLO_CONFIG.classes[name].resolve_ms(BASELINE_MS)
        np.testing.assert_allclose(workload.tpot_slo_ms[picked], expected)
    # Azure rows keep their counts.
    azure = trace_workload([TraceRow(0.0, 700, 90), TraceRow(2.0, 30, 5)], SLO_CONFIG, 40.0)
    assert azure.prompt_tokens.tolist() == [700, 30] and azure.output_tokens.tolist() == [90, 5]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"time_compression": 0.0}, "time compression"), ({"relative_slo_scale": -1}, "scale")],
)
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        trace_workload(adaserve_rows(), SLO_CONFIG, BASELINE_MS, **kwargs)


def test_cli_replays_an_adaserve_trace(tmp_path, capsys):
    rng = np.random.default_rng(0)
    entries = [
        {
            "emission_time_ms": float(t), "prompt": "x", "input_length": 120,
            "output_length": 40, "slo_ratio": float(rng.choice([1.2, -50.0, -150.0])),
        }
        for t in np.cumsum(rng.exponential(250.0, 40))
    ]  # fmt: skip
    trace = tmp_path / "adaserve_small.json"
    trace.write_text(json.dumps(entries))
    code = sim_cli.main(
        ["--experiment", "trace", "--trace", str(trace), "--time-compression", "2",
         "--policies", "none,static,adaserve", "--repeats", "1", "--out", str(tmp_path)]
    )  # fmt: skip
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    name, value = lines[-1].split("=")
    assert name == "adaserve_minus_best_other_attainment_points" and not math.isnan(float(value))
    result = json.loads((tmp_path / "trace_adaserve_small_x2.json").read_text())
    assert [row["policy"] for row in result["rows"]] == ["none", "static", "adaserve"]
    assert result["requests"] == 40
    assert result["rate_rps"] == pytest.approx(
        2 * 39 / (entries[-1]["emission_time_ms"] - entries[0]["emission_time_ms"]) * 1000
    )
    best_other = max(r["attainment"] for r in result["rows"][:2])
    assert float(value) == pytest.approx(
        100 * (result["rows"][2]["attainment"] - best_other), abs=0.01
    )
