"""The bench end to end on CPU: `python -m sgl_adaspec.bench` starts two servers with the tiny
model (no speculation, then adaserve), one at a time, measures the baseline TPOT on the first,
and replays the same generated 8-request AdaServe-format trace against both."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

NUM_REQUESTS = 8
POLICIES = ("none", "adaserve")


def generated_trace(path):
    """8 requests 0.3 s apart, AdaServe's three SLO kinds (relative 1.2x, 50 ms, 150 ms)."""
    prompts = ["def fibonacci(n):", "import os\nimport sys\n", "class Stack:\n    def pop(self):",
               "Summarize: the cat sat on the mat."]  # fmt: skip
    ratios = [1.2, -50.0, -150.0, 1.2]
    entries = [
        {"emission_time_ms": 300.0 * i, "prompt": prompts[i % 4], "input_length": 8,
         "output_length": 12 + 2 * (i % 3), "slo_ratio": ratios[i % 4]}
        for i in range(NUM_REQUESTS)
    ]  # fmt: skip
    path.write_text(json.dumps(entries))
    return path


@pytest.mark.slow
def test_bench_starts_two_servers_and_replays(models, tmp_path):
    trace = generated_trace(tmp_path / "trace.json")
    out = tmp_path / "out"
    command = [
        sys.executable, "-m", "sgl_adaspec.bench", "--trace", str(trace),
        "--policies", ",".join(POLICIES), "--model", str(models.target),
        "--draft-model", str(models.eagle_draft), "--out", str(out), "--no-progress",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    print(done.stdout)  # the table, shown with pytest -s

    lines = done.stdout.strip().splitlines()
    assert lines[-1].split("=")[0] == "best_attainment_policy"
    assert lines[-1].split("=")[1] in POLICIES

    result = json.loads((out / "results.json").read_text())
    assert result["baseline_tpot_ms"] > 0  # measured on the no-speculation server
    assert [run["label"] for run in result["runs"]] == list(POLICIES)
    for run in result["runs"]:
        assert run["status"] == "ok", run["reason"]
        overall = run["summary"]["overall"]
        assert overall["num_requests"] == overall["num_completed"] == NUM_REQUESTS
        assert 0.0 <= overall["attainment"] <= 1.0
        assert all(r["error"] is None for r in run["requests"])
        assert [r["output_tokens"] for r in run["requests"]] == [12 + 2 * (i % 3) for i in
                                                                  range(NUM_REQUESTS)]  # fmt: skip
        assert set(run["summary"]["per_class"]) == {"coding", "chat", "summarization"}
    adaserve = result["runs"][1]
    assert adaserve["server_stats"]["accepted_tokens_per_verify"] >= 1.0
    assert adaserve["summary"]["overall"]["accepted_tokens_per_verify"] >= 1.0
    assert result["runs"][0]["summary"]["overall"]["accepted_tokens_per_verify"] is None
    for name in ("load_sweep.png", "per_class.png"):
        png = (out / name).read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 5000
