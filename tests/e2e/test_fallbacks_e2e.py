"""A policy that fails is seen: its fallbacks are counted in /server_info and /metrics while
the server stays lossless, and under the strict switch (the test suite's default) the first
one fails the run. The failing policy is tetris with `ADASPEC_FAULT_EVERY=5` (every fifth
decision raises): tetris decides on every speculative iteration."""

from __future__ import annotations

import pytest
import requests

from sgl_adaspec.adapters.speculative.fallbacks import (
    FAULT_EVERY_ENV,
    FAULT_IN_ENV,
    STRICT_ENV,
    Fallback,
    InjectedFault,
    inject_faults,
)
from sgl_adaspec.local_server.launch import Server, eagle_flags

from .conftest import metric_values
from .mixed_batch import concurrent_outputs, run_policy

FAULTY = {FAULT_EVERY_ENV: "5"}


def test_a_failing_policy_is_counted_and_served_losslessly_without_the_strict_switch(
    models, tmp_path_factory, random_pair_reference
):
    outputs, state = run_policy(
        tmp_path_factory, models.target, models.eagle_draft, ("tetris",), "--enable-metrics",
        env={**FAULTY, STRICT_ENV: "0"}, allow_fallbacks=True,
    )  # fmt: skip
    assert outputs == random_pair_reference
    failed = state["fallbacks"]["decision"]
    decided = state["stats"]["iterations"]
    # One decision in five raised; the other four were observed as speculative iterations.
    assert failed >= 1 and decided >= 4 * failed - 4, state
    assert {k: v for k, v in state["fallbacks"].items() if k != "decision"} == dict.fromkeys(
        ("plan", "observe", "early_exit", "cost_profile", "tier_build", "replica_report",
         "slo_load"), 0
    )  # fmt: skip
    series = metric_values(state["metrics"])
    assert series['sglang_adaspec:fallbacks_total{reason="decision"}'] == failed
    assert series['sglang_adaspec:fallbacks_total{reason="tier_build"}'] == 0


@pytest.mark.slow
def test_under_the_strict_switch_the_first_fallback_stops_the_server(models, tmp_path_factory):
    flags = eagle_flags(models.eagle_draft, steps=4, topk=2, num_draft_tokens=8)
    log = tmp_path_factory.mktemp("strict-faulty") / "server.log"
    server = Server(
        models.target, (*flags, "--spec-policy", "tetris"), env=FAULTY, log_path=log
    )
    try:
        # The fifth decision may come in SGLang's start-up warm-up or in these requests.
        with pytest.raises((RuntimeError, requests.RequestException, KeyError)):
            server.start()
            for _ in range(5):
                concurrent_outputs(server.url)
        server.process.wait(timeout=120)
    finally:
        server.stop()
    assert "FallbackError" in log.read_text()
    assert server.process.returncode != 0


@pytest.mark.slow
def test_a_policy_failing_to_plan_or_to_observe_is_counted_and_served_losslessly(
    models, tmp_path_factory, random_pair_reference
):
    # Every fifth plan and every fifth outcome taken raise: the configured search runs and is
    # decided, the outcome is lost to the policy; the server goes on serving.
    env = {**FAULTY, FAULT_IN_ENV: "draft_shape,observe", STRICT_ENV: "0"}
    outputs, state = run_policy(
        tmp_path_factory, models.target, models.eagle_draft, ("tetris",), env=env,
        allow_fallbacks=True,
    )  # fmt: skip
    assert outputs == random_pair_reference
    failed = {reason for reason, count in state["fallbacks"].items() if count}
    assert failed == {Fallback.PLAN, Fallback.OBSERVE}, state["fallbacks"]


class _Policy:
    def decide(self, it):
        return it

    def observe(self, outcome):
        return outcome


def test_faults_go_only_into_the_calls_named(monkeypatch):
    monkeypatch.setenv(FAULT_EVERY_ENV, "2")
    monkeypatch.setenv(FAULT_IN_ENV, "observe")
    policy = _Policy()
    inject_faults(policy)
    assert [policy.decide(i) for i in range(4)] == [0, 1, 2, 3]
    assert policy.observe(0) == 0
    with pytest.raises(InjectedFault):
        policy.observe(1)
    monkeypatch.setenv(FAULT_IN_ENV, "observe,verify")
    with pytest.raises(ValueError, match="verify"):
        inject_faults(_Policy())
