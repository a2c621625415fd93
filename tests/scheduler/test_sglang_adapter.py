"""The scheduler adapter's prefill bound on hand-built running batches (fakes of SGLang's Req
and batch: only the attributes the adapter reads)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sgl_adaspec.adapters.scheduler import bound_prefill
from sgl_adaspec.adapters.speculative import runtime as plugin_runtime
from sgl_adaspec.adapters.speculative.request_state import RequestState
from sgl_adaspec.config import AdaspecConfig
from sgl_adaspec.scheduler.cost_model import VerifyCostProfile
from sgl_adaspec.scheduler.request_slo import RequestSlo
from sgl_adaspec.speculative.stats import SpecStats

PROFILE = {"tokens": [8, 64], "latency_ms": [10.0, 38.0]}  # 0.5 ms per extra token
NOW_S = 1000.0  # the plugin's clock in these tests (`runtime.now_s`)


def running_req(tpot_slo_ms, decoded_ms, tokens_out, infeasible=False):
    stats = SpecStats(cost_profile=PROFILE)
    state = RequestState(
        RequestSlo("custom", tpot_slo_ms=tpot_slo_ms),
        first_token_s=NOW_S - decoded_ms / 1000,
        tokens_at_start=0,
        policy=SimpleNamespace(stats=stats),
        infeasible=infeasible,
    )
    return SimpleNamespace(_adaspec_state=state, output_ids=[0] * tokens_out)


def adder_args(reqs, rem_input=16384, rem_chunk=4096):
    batch = SimpleNamespace(reqs=reqs)
    return ("adder", 1, "tree", "allocator", batch, 0.5, rem_input, rem_chunk)


@pytest.fixture(autouse=True)
def adaserve_config(monkeypatch):
    config = AdaspecConfig(spec_policy="adaserve")
    monkeypatch.setenv("ADASPEC_CONFIG", config.to_json())
    # The scheduler's runtime holds the start-up verify cost profile.
    profile = VerifyCostProfile(tuple(PROFILE["tokens"]), tuple(PROFILE["latency_ms"]))
    monkeypatch.setattr(plugin_runtime, "_RUNTIME", plugin_runtime.Runtime(config, cost_profile=profile))
    monkeypatch.setattr(plugin_runtime, "now_s", lambda: NOW_S)


def test_request_behind_its_slo_caps_the_prefill():
    # 50 ms SLO, 10 tokens in 500 ms: allowance 50 * 11 - 500 = 50 ms -> 100 tokens at 0.5 ms.
    args, _ = bound_prefill(*adder_args([running_req(50.0, 500.0, 10)]))
    assert args[6] == 100 and args[7] == args[6]


def test_request_ahead_of_its_slo_leaves_sglang_limits_alone():
    # Allowance 50 * 41 - 100 = 1950 ms -> 3900 tokens, more than the 2048-token chunk limit.
    assert bound_prefill(*adder_args([running_req(50.0, 100.0, 40)], rem_chunk=2048)) is None


def test_infeasible_and_best_effort_requests_have_no_say():
    reqs = [running_req(1.0, 500.0, 10, infeasible=True), running_req(None, 500.0, 10)]
    assert bound_prefill(*adder_args(reqs)) is None


def test_off_when_slo_admission_is_off(monkeypatch):
    config = AdaspecConfig(spec_policy="adaserve", slo_admission="off")
    monkeypatch.setenv("ADASPEC_CONFIG", config.to_json())
    assert bound_prefill(*adder_args([running_req(50.0, 500.0, 10)])) is None
