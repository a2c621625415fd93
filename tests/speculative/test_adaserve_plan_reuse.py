"""adaserve's plans kept for reuse (`adaserve.plan_reuse`), on their own and through the
policy's plans."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

import torch
from adaserve_inputs import (
    beam,
    slo,
    standing_down_policy,
    verified_outcome,
)
from policy_inputs import iteration_input

from sgl_adaspec.speculative.adaserve.plan_reuse import PLAN_REUSE, PlanReuse, same_batch
from sgl_adaspec.speculative.adaserve.planner import PlanChoice

# Plain decodes measured at 50x the first price: speculation pays against them.
DEARER_PLAIN = [((1, 10), 500.0), ((2, 10), 500.0)] * 20


def test_a_stand_down_stands_on_its_batch_for_plan_reuse_iterations():
    policy = standing_down_policy(probe_interval=100)
    two = slo([math.nan, math.nan])
    standing = policy._cost_plan(two)
    assert standing.depth == 0
    # The plain price moves (every plain iteration refits it): speculation would pay now, but
    # the stand-down is re-planned only after PLAN_REUSE iterations on this batch.
    policy.plain_latency.seed(DEARER_PLAIN)
    reused = [policy._cost_plan(two) for _ in range(PLAN_REUSE - 1)]
    assert all(plan is standing for plan in reused)
    assert policy._cost_plan(two).depth > 0
    # A new batch is planned at once, and so is the batch after a draft ran.
    policy = standing_down_policy(probe_interval=100)
    assert policy._cost_plan(two).depth == 0
    policy.plain_latency.seed(DEARER_PLAIN)
    assert policy._cost_plan(slo([math.nan, 50.0])).depth > 0
    policy = standing_down_policy(probe_interval=100)
    assert policy._cost_plan(two).depth == 0
    policy.plain_latency.seed(DEARER_PLAIN)
    drafted_now = iteration_input(beam([[[0.5, 0.5]] * 4]), 4, 2)
    policy.observe(verified_outcome(drafted_now, policy.decide(drafted_now), 2, width=2))
    assert policy._cost_plan(two).depth > 0


def test_a_plan_serves_plan_reuse_iterations_while_the_models_refit():
    policy = standing_down_policy(probe_interval=100)
    policy.plain_latency.seed(DEARER_PLAIN)
    policy.verify_latency.seed([((1, 10), 10.0), ((8, 10), 80.0)] * 20)  # 42 observations
    two = slo([math.nan, math.nan])
    planned = policy._cost_plan(two)
    assert planned.depth > 0
    fits, reused = policy.verify_latency.version, []
    for _ in range(PLAN_REUSE - 1):
        policy.verify_latency.seed([((8, 10), 80.0)] * 2)  # 42 to 56: within 2x
        policy.verify_latency.coefficients()  # refits, as the selection's reads do
        reused.append(policy._cost_plan(two))
    assert policy.verify_latency.version > fits  # the fit moved, the plan stood
    assert all(plan is planned for plan in reused)
    assert policy._cost_plan(two) is not planned  # and is remade after PLAN_REUSE
    # A model's observations doubling is news: the plan is remade at once.
    planned = policy._cost_plan(two)
    policy.draft_latency.seed([((1, 1), 2.0), ((4, 7), 8.0)])
    assert policy._cost_plan(two) is not planned
    # So is a surprise: a verify larger than any held, priced far from what it took.
    planned = policy._cost_plan(two)
    observations = policy.verify_latency.num_observations
    policy.verify_latency.seed([((64, 10), 5000.0)])
    assert int(math.log2(1 + observations)) == int(math.log2(2 + observations))
    assert policy.verify_latency.surprises == 1
    assert policy._cost_plan(two) is not planned


def test_a_plan_serves_a_batch_whose_groups_drift_within_batch_drift():
    """Under load requests come and go nearly every iteration; a plan serves while each SLO
    group's count stays within BATCH_DRIFT of the one it was made for, and no longer once a
    group drifts past it, a group appears, or a request turns blind to the draft."""
    assert same_batch(Counter({(50.0, False): 10}), Counter({(50.0, False): 12}))
    assert not same_batch(Counter({(50.0, False): 10}), Counter({(50.0, False): 13}))
    assert not same_batch(Counter({(50.0, False): 3}), Counter({(50.0, False): 4}))
    assert not same_batch(None, Counter({(50.0, False): 3}))
    policy = standing_down_policy(probe_interval=100)
    policy.plain_latency.seed(DEARER_PLAIN)
    planned = policy._cost_plan(slo([50.0] * 10))
    assert planned.depth > 0
    assert policy._cost_plan(slo([50.0] * 11)) is planned
    assert policy._cost_plan(slo([50.0] * 9)) is planned
    assert policy._cost_plan(slo([50.0] * 13)) is not planned  # 30 % more: planned anew
    planned = policy._cost_plan(slo([50.0] * 10))
    assert policy._cost_plan(slo([50.0] * 10 + [math.nan])) is not planned  # a new group
    planned = policy._cost_plan(slo([50.0] * 10))
    blind = slo([50.0] * 10)
    blind = dataclasses.replace(blind, draft_blind=torch.tensor([True] + [False] * 9))
    assert policy._cost_plan(blind) is not planned


def test_a_stand_down_serves_its_batch_until_a_new_load_is_measured():
    reuse, batch = PlanReuse(), Counter({(-1.0, False): 4})
    standing, speculating = choice(0), choice(2)
    reuse.note(batch, speculating, loads_measured=1)
    assert reuse.standing_down is None  # a plan that speculates is not a stand-down
    reuse.note(batch, standing, loads_measured=1)
    assert [reuse.standing(batch, 1) for _ in range(PLAN_REUSE - 1)] == [standing] * (
        PLAN_REUSE - 1
    )
    assert reuse.standing(batch, 1) is None  # served PLAN_REUSE iterations
    reuse.note(batch, standing, loads_measured=1)
    assert reuse.standing(batch, 2) is None  # a price measured at a new load is news
    assert reuse.standing(Counter({(-1.0, False): 5}), 1) is None  # another batch


def test_a_kept_plan_serves_within_a_step_of_its_inputs():
    reuse, batch = PlanReuse(), Counter({(50.0, False): 10})
    made_for = (batch, 0.1, 1.0, 101, 0.2)
    assert reuse.reuse("key", made_for) == (False, None)
    reuse.keep("key", choice(2), made_for)
    assert reuse.reuse("key", (batch, 0.12, 1.05, 140, 0.25)) == (True, choice(2))
    assert reuse.reuse("key", (batch, 0.14, 1.0, 101, 0.2))[0] is False  # the margin moved
    assert reuse.reuse("key", (batch, 0.1, 1.0, 150, 0.2))[0] is False  # the context grew 50 %
    # A plan and a floor's are kept: a third key evicts the oldest.
    reuse.keep("floor", choice(1), made_for)
    reuse.keep("other", choice(3), made_for)
    assert list(reuse.plans) == ["floor", "other"]


def choice(depth: int) -> PlanChoice:
    return PlanChoice(depth, 1, depth, 1.0, 0.1, 0.1, 10.0, 10.0)
