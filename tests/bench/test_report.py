"""Bench outputs from a hand-made result (no servers): tables, closing lines, JSON, PNGs, with an
unavailable policy among them."""

from __future__ import annotations

import json

from sgl_adaspec.bench.metrics import RequestRecord, summarize
from sgl_adaspec.bench.plots import plot_load_sweep, plot_per_class
from sgl_adaspec.bench.report import best_attainment_label, closing_lines, render, write_json
from sgl_adaspec.bench.runner import BenchResult, RunResult


def run(label, rate, tpots_ms, slo_ms=50.0):
    records = tuple(
        RequestRecord(i, "chat" if i % 2 else "coding", slo_ms, 0.1 * i, 11, ttft_ms=5.0,
                      decode_ms=10 * tpot, e2e_ms=10 * tpot + 5, spec_verify_ct=5)
        for i, tpot in enumerate(tpots_ms)
    )  # fmt: skip
    return RunResult(label, label, rate, "ok", None, summarize(list(records), 2.0), records)


def make_result() -> BenchResult:
    runs = (
        run("none", 1.0, [40, 60]), run("none", 2.0, [60, 70]),
        run("adaserve", 1.0, [40, 45]), run("adaserve", 2.0, [45, 70]),
        RunResult("sglang-adaptive", "sglang-adaptive", 1.0, "unavailable", "switched off: why"),
        RunResult("sglang-adaptive", "sglang-adaptive", 2.0, "unavailable", "switched off: why"),
    )  # fmt: skip
    return BenchResult("toy", 2, 1.5, ("chat", "coding"), 10.0, runs)


def test_closing_lines_name_the_best_policy_last():
    result = make_result()
    # Mean attainment: none (0.5 + 0) / 2 = 0.25; adaserve (1 + 0.5) / 2 = 0.75.
    assert closing_lines(result) == [
        "attainment_none=0.2500", "attainment_adaserve=0.7500", "best_attainment_policy=adaserve"
    ]  # fmt: skip
    nothing = BenchResult("toy", 2, 1.5, (), None, make_result().runs[-2:])
    assert best_attainment_label(nothing) == "unavailable"


def test_render_lists_every_run_and_the_reason_of_unavailable_ones():
    text = render(make_result(), [])
    assert text.splitlines()[-1] == "best_attainment_policy=adaserve"
    assert "sglang-adaptive: unavailable: switched off: why" in text
    assert "baseline TPOT (no speculation, batch 1): 10.00 ms" in text
    rows = [line.split() for line in text.splitlines() if line.startswith(("none", "adaserve"))]
    assert ["none", "1", "ok", "2/2", "1", "0.500"] == rows[0][:6]
    assert any(r[:3] == ["adaserve", "2", "chat"] for r in rows)  # per-class table row


def test_json_and_pngs(tmp_path):
    result = make_result()
    data = json.loads(write_json(result, tmp_path / "r.json").read_text())
    assert [r["status"] for r in data["runs"]].count("unavailable") == 2
    first = data["runs"][0]
    assert first["summary"]["overall"]["attainment"] == 0.5
    assert first["requests"][0]["mean_tpot_ms"] == 40.0 and first["requests"][0]["slo_met"]
    for plot, name in ((plot_load_sweep, "load.png"), (plot_per_class, "classes.png")):
        path = plot(result, tmp_path / name)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
