"""adaserve end to end on CPU: mixed TPOT SLOs in one batch under a tight budget. Outputs stay
token-identical to no speculation, and the request behind its SLO verifies more tokens per
iteration than the relaxed one while both run."""

from __future__ import annotations

import concurrent.futures

import pytest
import requests

from sgl_adaspec.local_server import client
from sgl_adaspec.local_server.launch import eagle_flags
from sgl_adaspec.speculative.metrics import VERIFIED_TOKENS_KEY, verified_per_iteration

from .conftest import metric_values, start

# The tight target is reachable in principle (an iteration of ~10 ms committing up to d + 1
# tokens) but the random draft is almost never accepted, so that request is always behind.
TIGHT, LOOSE = ("def fibonacci(n):", 5.0), ("import os\nimport sys\n\n", 5000.0)
MAX_NEW_TOKENS = 40


def generate(url: str, prompt: str, custom_params: dict | None = None, temperature: float = 0.0):
    # Sampled requests ignore EOS: a random tiny model can draw it before MAX_NEW_TOKENS.
    return client.generate(
        url, prompt, MAX_NEW_TOKENS, custom_params, temperature, ignore_eos=temperature > 0
    )


@pytest.fixture(scope="module")
def adaserve_outputs(models, tmp_path_factory):
    """Both requests sent concurrently to a server with budget 8 (2 roots + 6 draft nodes)."""
    flags = (
        *eagle_flags(models.eagle_draft, steps=3, topk=4, num_draft_tokens=8),
        "--spec-policy", "adaserve", "--adaserve-budget-rule", "knee", "--adaserve-budget", "8",
        "--enable-metrics",
    )  # fmt: skip
    server = start(tmp_path_factory, "adaserve", models.target, *flags)
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            jobs = [(p, {"tpot_slo_ms": slo}) for p, slo in (TIGHT, LOOSE)]
            outputs = list(pool.map(lambda job: generate(server.url, *job), jobs))
        # Sampling (tree verification under sampling on the pruned tree) after the pair is done.
        sampled = generate(server.url, TIGHT[0], temperature=0.8)
        assert sampled["meta_info"]["completion_tokens"] == MAX_NEW_TOKENS
        streamed = client.stream_generate(server.url, LOOSE[0], MAX_NEW_TOKENS, ignore_eos=True)
        info = requests.get(f"{server.url}/server_info", timeout=60).json()
        metrics = requests.get(f"{server.url}/metrics", timeout=60).text
        return outputs, info["internal_states"][0]["adaspec"], metrics, streamed.meta_info
    finally:
        server.stop()


def test_mixed_slo_batch_is_token_identical_to_no_speculation(plain_server, adaserve_outputs):
    expected = [generate(plain_server.url, prompt)["output_ids"] for prompt, _ in (TIGHT, LOOSE)]
    outputs, _, _, _ = adaserve_outputs
    assert [out["output_ids"] for out in outputs] == expected


def test_tight_slo_gets_more_verified_tokens_than_loose(adaserve_outputs):
    outputs, _, _, _ = adaserve_outputs
    tight, loose = (verified_per_iteration(out["meta_info"]) for out in outputs)
    # Compare the iterations both requests ran together (same batch, same budget).
    together = min(len(tight), len(loose))
    assert together >= 10
    tight_mean = sum(tight[:together]) / together
    loose_mean = sum(loose[:together]) / together
    assert tight_mean > loose_mean, (tight, loose)


def test_a_streamed_response_carries_every_speculative_iterations_verified_tokens(
    adaserve_outputs,
):
    """SGLang slices customized info by output token in each streamed chunk: the counts are
    token-aligned, so the last chunk holds one per speculative iteration (every iteration of
    the knee rule speculates), each within the budget, none past the output."""
    meta = adaserve_outputs[3]
    counts = verified_per_iteration(meta)
    assert len(counts) == meta["spec_verify_ct"] >= 10
    assert all(1 <= count <= 8 for count in counts)
    assert len(meta[VERIFIED_TOKENS_KEY]) <= meta["completion_tokens"]


def test_server_info_reports_policy_state_and_per_class_attainment(adaserve_outputs):
    _, state, _, _ = adaserve_outputs
    assert state["spec_policy"] == "adaserve"
    stats = state["stats"]
    assert stats["budget"] == 8 and stats["iterations"] >= 10
    assert 2 <= stats["verified_tokens_per_iteration"] <= 8
    assert stats["max_verified_tokens_per_iteration"] <= 8  # never above the budget
    assert stats["accepted_tokens_per_verify"] >= 1.0
    # The verify pass's committed tokens named each request's accepted path, so every verified
    # node trained the calibration.
    assert stats["calibration_trials"] >= stats["iterations"]
    # Iterations predicted after the calibration's warm-up are summed apart (none before it).
    assert 0 <= stats["settled_iterations"] < stats["iterations"]
    assert stats["settled_accepted_draft_tokens"] >= 0
    custom = stats["classes"]["custom"]  # both requests stated tpot_slo_ms directly
    assert custom["finished"] == 2
    assert 1 <= custom["met"] <= 2  # the 5 s request is always met


def test_prometheus_metrics_carry_slo_class_labels(adaserve_outputs):
    _, state, metrics, _ = adaserve_outputs
    lines = metric_values(metrics)
    # A bare tpot_slo_ms is labelled by its TPOT bucket: 5 ms and 5 s fall in two.
    tight, loose = 'slo_class="custom_le_5ms"', 'slo_class="custom_gt_2000ms"'
    assert lines[f"sglang_adaspec:requests_finished_total{{{tight}}}"] == 1
    assert lines[f"sglang_adaspec:requests_finished_total{{{loose}}}"] == 1
    assert 'sglang_adaspec:requests_finished_total{slo_class="custom"}' not in lines
    # As many met as /server_info counts (whether the 5 ms one is met depends on the host).
    met = state["stats"]["classes"]["custom"]["met"]
    met_series = (f"sglang_adaspec:requests_slo_met_total{{{label}}}" for label in (tight, loose))
    assert sum(lines[name] for name in met_series) == met
    assert lines[f"sglang_adaspec:requests_slo_met_total{{{loose}}}"] == 1
    # The configured classes' counters exist from start-up, at 0 (no chat request was sent).
    assert lines['sglang_adaspec:requests_finished_total{slo_class="chat"}'] == 0
    assert lines['sglang_adaspec:requests_slo_met_total{slo_class="chat"}'] == 0
    assert lines['sglang_adaspec:iteration_shape{parameter="budget"}'] == 8
    assert lines["sglang_adaspec:verified_tokens_per_iteration_count"] >= 10
    # TPOT in seconds as SGLang's own histogram, the deprecated ms one beside it.
    seconds = f"sglang_adaspec:request_time_per_output_token_seconds_sum{{{loose}}}"
    millis = f"sglang_adaspec:request_tpot_ms_sum{{{loose}}}"
    assert lines[seconds] == pytest.approx(lines[millis] / 1000)


def test_budget_comes_from_the_startup_verify_cost_profile(eagle_server):
    """Without --adaserve-budget the server profiles the target's verify pass at start-up and
    sets B at the knee of the measured curve."""
    from sgl_adaspec.scheduler.cost_model import VerifyCostProfile, knee_budget

    eagle_server.generate("def f(x):", 8)
    state = requests.get(f"{eagle_server.url}/server_info", timeout=60).json()
    stats = state["internal_states"][0]["adaspec"]["stats"]
    profile = stats["cost_profile"]
    assert len(profile["tokens"]) >= 2 and all(t > 0 for t in profile["latency_ms"])
    expected = knee_budget(
        VerifyCostProfile(tuple(profile["tokens"]), tuple(profile["latency_ms"]))
    )
    assert stats["budget"] == expected
