"""SGLang's own serving benchmark runs against the plugin's server out of the box: the project's
command line for it (`sgl_adaspec.bench.sglang_serving.bench_command`) against the tiny bigram
pair with adaserve (the draft is always right, so speculation pays), the SLO class carried by
`--extra-request-body` to every request."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import requests

from sgl_adaspec.bench.sglang_serving import (
    ServingBench, bench_command, last_result, spec_bench_sharegpt,
)  # fmt: skip
from sgl_adaspec.data import SPEC_BENCH_QUESTIONS
from sgl_adaspec.local_server.launch import eagle_flags

from .conftest import start


@pytest.mark.slow
@pytest.mark.parametrize("dataset", ["random-ids", "spec-bench"])
def test_bench_serving_reports_accept_length_above_one(models, tmp_path_factory, dataset):
    out = tmp_path_factory.mktemp(f"bench-serving-{dataset}")
    bench = ServingBench(
        model_path=models.bigram_target, draft=models.bigram_eagle_draft, device="cpu",
        steps=3, topk=2, draft_tokens=6, policies=("adaserve",), rates=(4.0,), num_prompts=4,
        input_len=32, output_len=16, slo_class="chat", out=out,
    )  # fmt: skip
    # The knee rule speculates every iteration; the cost rule may find that even this draft does
    # not pay on a loaded CPU and stand down, which is not what this test is about.
    server = start(tmp_path_factory, "bench-serving", models.bigram_target,
                   *eagle_flags(bench.draft, 3, 2, 6), "--spec-policy", "adaserve",
                   "--adaserve-budget-rule", "knee",
                   # SGLang folds iterations into the accept length its benchmark reads from
                   # /server_info at each decode log line (every 40 iterations by default).
                   "--decode-log-interval", "1")  # fmt: skip
    try:
        sharegpt = spec_bench_sharegpt(SPEC_BENCH_QUESTIONS, out / "sharegpt.json")
        result = out / "result.jsonl"
        cmd = bench_command(bench, server.url, dataset, 4.0, result, sharegpt)
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        info = requests.get(f"{server.url}/server_info", timeout=60).json()
    finally:
        server.stop()
    row = last_result(Path(result))
    assert row["completed"] == 4
    assert row["accept_length"] > 1.0
    # Every request (the benchmark's one warm-up request included) reached the scheduler under
    # the class that --extra-request-body named.
    classes = info["internal_states"][0]["adaspec"]["stats"]["classes"]
    assert classes["chat"]["finished"] == bench.num_prompts + 1, classes
