"""Simulator policy adapters: shapes, budget, SGLang-style adaptive steps."""

from __future__ import annotations

import numpy as np
import torch

from sgl_adaspec.scheduler.slo import SloBatch
from sgl_adaspec.sim.acceptance import SYNTHETIC_DEFAULT
from sgl_adaspec.sim.policies import AdaptiveSteps, SimStep, make_policy
from sgl_adaspec.sim.trees import draft_trees


def _slo(tpot_ms, elapsed_ms, tokens_out):
    return SloBatch(
        torch.tensor(tpot_ms, dtype=torch.float64),
        torch.tensor(elapsed_ms, dtype=torch.float64),
        torch.tensor(tokens_out, dtype=torch.float64),
    )


def _drafter(num_requests, seed=0):
    rng = np.random.default_rng(seed)
    alpha, beta = SYNTHETIC_DEFAULT.class_params(["chat"] * num_requests)
    return lambda depth, width: draft_trees(SYNTHETIC_DEFAULT, rng, alpha, beta, depth, width)


def test_static_verifies_sglangs_eight_tokens_per_request():
    policy = make_policy("static", 64, 30.0)
    decision = policy.decide(_slo([40.0] * 3, [0.0] * 3, [0] * 3), _drafter(3))
    assert decision.verified.tolist() == [8, 8, 8]
    assert decision.draft_forward_tokens == (3, 12, 12, 12, 12)


def test_no_speculation_verifies_one_token():
    policy = make_policy("none", 64, 30.0)
    decision = policy.decide(_slo([40.0] * 2, [0.0] * 2, [0] * 2), _drafter(2))
    assert decision.trees is None and decision.verified.tolist() == [1, 1]


def test_adaserve_keeps_the_budget_and_serves_the_late_request_first():
    # Request 0 is far behind a 20 ms SLO; the others are best effort. Budget 12 for 4 requests.
    slo = _slo([20.0, float("nan"), float("nan"), float("nan")], [400.0, 0, 0, 0], [5, 0, 0, 0])
    policy = make_policy("adaserve-knee", 12, 30.0)  # the paper's rule: B is the given budget
    decision = policy.decide(slo, _drafter(4), ("0", "1", "2", "3"), np.full(4, 100))
    assert decision.verified.sum() <= 12
    assert decision.verified[0] == decision.verified.max() > 1
    assert decision.budget == 12


def _feed(policy: AdaptiveSteps, num_requests: int, accepted: int, batches: int) -> None:
    for _ in range(batches):
        step = SimStep((), None, None, np.ones(num_requests, dtype=np.int64))
        policy.observe(step, np.full(num_requests, accepted + 1), 10.0, 5.0)  # bonus included


def test_adaptive_steps_follow_the_accept_length():
    policy = AdaptiveSteps()
    assert policy.tier(1).steps == 3 and policy.tier(8).steps == 3 and policy.tier(64).steps == 0
    _feed(policy, 1, accepted=7, batches=40)
    assert policy.tier(1).steps == 7
    _feed(policy, 1, accepted=0, batches=60)
    assert policy.tier(1).steps == 1
    # A large batch runs without speculation in SGLang's default tiers.
    assert (
        make_policy("sglang-adaptive", 64, 30.0)
        .decide(_slo([40.0] * 70, [0.0] * 70, [0] * 70), _drafter(70))
        .trees
        is None
    )
