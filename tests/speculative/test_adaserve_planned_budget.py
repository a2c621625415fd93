"""adaserve verifies what its plan priced: a draft of the plan's shape, or of a shape covering
it (a server's draft tier, or the configured search), gets the plan's n x k candidate nodes,
fixed before the draft, so nothing but the selection runs between the draft and the verify; a
draft no plan shaped gets the budget where tokens per ms peak on its own nodes
(`cost_budget`). Either way no node the calibration expects nothing of is verified."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from sgl_adaspec.speculative.adaserve import policy as policy_module
from sgl_adaspec.speculative.adaserve.config import AdaserveConfig
from sgl_adaspec.speculative.adaserve.modes import Mode
from sgl_adaspec.speculative.adaserve.planner import cost_budget
from sgl_adaspec.speculative.selection import select_within
from tests.speculative.adaserve_inputs import beam, slo, speculating_policy
from tests.speculative.policy_inputs import iteration_input
from tests.speculative.test_adaserve_slo_terms import _random_beams

BATCH = ([20.0, 200.0, 60.0], [30.0, 0.0, 90.0], [3.0, 0.0, 6.0])  # TPOT SLO, elapsed, tokens


CONFIGURED = (4, 2)  # the configured search (--speculative-num-steps, --speculative-eagle-topk)


def _planned(requests: int, budget: int | None = None, cands=None, runs=None):
    """A policy whose plan speculates for `requests` requests, and the iteration of its draft:
    random beams of the plan's shape, or of `runs` (told the policy before the draft, as the
    driver does), unless `cands`."""
    policy = speculating_policy(AdaserveConfig(budget=budget))
    policy.plain_latency.seed([((n, 10), 10.0) for n in range(1, requests + 1)])
    policy.observe_iteration(12.0)
    batch = slo(*(column[:requests] for column in BATCH))
    depth, width = policy.draft_shape(requests, *CONFIGURED, batch)
    assert policy.draft_state.mode is Mode.PLANNED and depth > 0
    if runs is not None:
        depth, width = runs
        policy.draft_runs(depth, width)
    if cands is None:
        cands = _random_beams(random.Random(requests), requests, depth, width)
    return policy, dataclasses.replace(iteration_input(cands, depth, width), slo=batch)


def _no_cost_budget(*args, **kwargs):
    raise AssertionError("a planned draft's budget is known before the draft")


def _terms_not_made_now(*args, **kwargs):
    raise AssertionError("the selection's terms are made before the draft")


@pytest.mark.parametrize("runs", [None, CONFIGURED])
@pytest.mark.parametrize("requests", [1, 2, 3])
def test_a_planned_draft_verifies_the_plans_nodes(requests, runs, monkeypatch):
    policy, it = _planned(requests, runs=runs)
    k = policy._running_plan.nodes_per_request
    if runs is not None:  # a covering draft: more nodes than the plan buys
        assert int(it.cands.valid.sum()) > requests * k
    monkeypatch.setattr(policy_module, "cost_budget", _no_cost_budget)
    monkeypatch.setattr(policy, "_terms_for", _terms_not_made_now)
    decision = policy.decide(it)
    assert decision.budget == requests * (1 + k)
    assert int(decision.selection.counts.sum()) == requests * k
    # The selection of today's code for that budget: the plan changes what is spent, not how.
    exact = policy.acceptance.apply_exact(it.cands.path_prob)
    expected = select_within(
        it.cands.derived(path_prob=exact), policy._slo_terms.demand, requests * k,
        -(-6 * k // 5),  # n_max = ceil(1.2 k)
    )  # fmt: skip
    assert torch.equal(decision.selection.mask, expected.mask)


def test_the_planned_budget_stays_within_the_configured_cap():
    policy, it = _planned(3, budget=5)
    assert 3 * policy._running_plan.nodes_per_request > 2  # the cap binds
    decision = policy.decide(it)
    assert decision.budget == 5
    assert int(decision.selection.counts.sum()) == 2


def test_the_plans_budget_buys_no_node_of_nothing_expected():
    # Request 1's draft is stale (f = 0, as after a plain iteration): the plan's budget for
    # two requests goes to request 0's nodes, never to nodes that cannot be accepted.
    cands = beam([[[0.9], [0.8]], [[0.0], [0.0]]])
    policy, it = _planned(2, cands=cands)
    assert policy._running_plan.nodes_per_request == 2
    decision = policy.decide(it)
    assert decision.selection.mask.tolist() == [[True, True], [False, False]]


def test_a_draft_no_plan_shaped_gets_the_budget_where_tokens_per_ms_peak():
    policy, it = _planned(2)
    policy._running_plan = policy._slo_terms = None  # as a probe's or an exploring draft
    decision = policy.decide(it)
    terms = policy._terms_for(it.slo, it.draft_depth, it.draft_width)
    assert terms.planned_nodes is None
    spend = terms.spend
    exact = policy.acceptance.apply_exact(it.cands.path_prob)
    peak = cost_budget(exact, it.cands.valid, spend.at(it.context_tokens))
    assert int(decision.budget) == 2 + int(peak)


def test_a_draft_narrower_than_the_plan_gets_no_planned_budget():
    # The plan's n x k priced its own shape: a draft that does not cover it (here shallower)
    # is budgeted on its own nodes, as one no plan shaped.
    policy, _ = _planned(2)
    plan = policy._running_plan
    assert plan.depth > 1
    policy.draft_runs(plan.depth - 1, plan.width)
    assert policy._slo_terms.planned_nodes is None
    covering = policy._terms_for(policy._slo_terms.slo, *CONFIGURED)
    assert covering.planned_nodes == 2 * plan.nodes_per_request
