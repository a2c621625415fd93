"""adaserve computes what its selection takes of the SLO state when it plans the draft, beside
the device's work, not between the draft and the verify: the decision must be the one it makes
computing them there."""

from __future__ import annotations

import copy
import dataclasses
import math
import random

import pytest
import torch

from sgl_adaspec.scheduler.slo import lead_weight, required_tokens
from sgl_adaspec.speculative.adaserve.config import AdaserveConfig
from tests.speculative.adaserve_inputs import beam, slo, speculating_policy
from tests.speculative.policy_inputs import iteration_input


def _random_beams(rng: random.Random, requests: int, depth: int, width: int):
    """f falling along each beam path, some requests' draft nearly useless."""
    f_by_request = []
    for _ in range(requests):
        levels = [sorted((rng.uniform(0.05, 0.95) for _ in range(width)), reverse=True)]
        for _ in range(depth - 1):
            levels.append([f * rng.uniform(0.05, 0.95) for f in levels[-1]])
        f_by_request.append(levels)
    return beam(f_by_request)


def _speculating(requests: int):
    # Below the floor the throughput phase weights nodes by how far behind their request is.
    policy = speculating_policy(AdaserveConfig(lead_floor=0.5))
    policy.plain_latency.seed([((n, 10), 10.0) for n in range(1, requests + 1)])
    policy.observe_iteration(12.0)
    return policy


@pytest.mark.parametrize("seed", range(6))
def test_slo_terms_planned_with_the_draft_decide_as_computed_at_the_decision(seed):
    rng = random.Random(seed)
    requests = rng.randint(1, 6)
    # Beyond any tree (2 ms), tight, loose, behind and best-effort requests mixed: every A(r)
    # mix of the two phases.
    batch = slo(
        [rng.choice([math.nan, 2.0, 3.5, 8.0, 20.0, 200.0]) for _ in range(requests)],
        [rng.uniform(0.0, 400.0) for _ in range(requests)],
        [float(rng.randint(0, 30)) for _ in range(requests)],
    )
    policy = _speculating(requests)
    depth, width = policy.draft_shape(requests, 4, 2, batch)
    assert depth > 0  # the plan speculates, so its terms were computed with it
    # The terms as AdaServe defines them: A(r) for the wall time to the next iteration, 0
    # for requests no depth-d tree could serve alone (4.3), nodes weighted by lead.
    terms, config, t_spec_ms = policy._slo_terms, policy.config, policy.t_spec_ms
    beyond = batch.has_slo & (batch.tpot_slo_ms < t_spec_ms / (depth + 1))
    required = required_tokens(batch, t_spec_ms * policy.wall_per_decode)
    assert torch.equal(terms.infeasible, beyond)
    assert torch.equal(terms.demand.required, torch.where(beyond, 0.0, required))
    assert torch.equal(
        terms.demand.rank_weight, lead_weight(batch, config.lead_scale, config.lead_floor)
    )
    cands = _random_beams(rng, requests, depth, width)
    it = dataclasses.replace(iteration_input(cands, depth, width), slo=batch)
    unplanned = copy.deepcopy(policy)
    unplanned._slo_terms = None  # as a draft the plan did not shape
    planned, computed = policy.decide(it), unplanned.decide(it)
    assert torch.equal(planned.selection.mask, computed.selection.mask)
    assert torch.equal(planned.infeasible, computed.infeasible)
    assert int(planned.budget) == int(computed.budget)
    assert torch.equal(planned.calibrated_f, computed.calibrated_f)


def test_terms_planned_for_another_shape_or_batch_are_not_used():
    policy = _speculating(2)
    batch = slo([20.0, 200.0])
    depth, width = policy.draft_shape(2, 4, 2, batch)
    planned = policy._slo_terms
    assert planned.shape == (depth, width) and planned.slo is batch
    other = slo([20.0, 200.0])  # the same values, another iteration's state
    cands = _random_beams(random.Random(0), 2, depth, width)
    policy.decide(dataclasses.replace(iteration_input(cands, depth, width), slo=other))
    assert policy._slo_terms is planned  # recomputed for that decision, the plan's kept
