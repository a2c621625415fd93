"""adaserve's decision between the draft and the verify, on device-resident candidates
(`host_reads`): no host read of what the draft wrote and no blocking copy to the device, and
the same decision as on host tensors (where it may take its read-to-skip shortcuts)."""

from __future__ import annotations

import copy
import math
import random

import pytest
import torch

from sgl_adaspec.scheduler.slo import SloBatch
from sgl_adaspec.speculative.adaserve.config import AdaserveConfig
from sgl_adaspec.speculative.adaserve.policy import AdaservePolicy
from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.host_reads import HostReadCounter, on_device
from sgl_adaspec.speculative.policies.base import IterationInput

FIELDS = ("tokens", "parents", "path_prob", "valid")


def beam_forest(rng: random.Random, requests: int, depth: int, width: int) -> Candidates:
    """Beam-search-like trees: `width` nodes a level, each under a random node one level up,
    f decreasing along paths, some requests with fewer levels (padding after)."""
    nodes = depth * width
    parents = torch.full((requests, nodes), -1, dtype=torch.long)
    prob = torch.zeros(requests, nodes, dtype=torch.float32)
    valid = torch.zeros(requests, nodes, dtype=torch.bool)
    for b in range(requests):
        levels = rng.randint(1, depth)
        for level in range(levels):
            for i in range(width):
                j = level * width + i
                parent = -1 if level == 0 else (level - 1) * width + rng.randrange(width)
                above = 1.0 if parent < 0 else float(prob[b, parent])
                parents[b, j], prob[b, j], valid[b, j] = parent, above * rng.random(), True
    tokens = torch.arange(requests * nodes).view(requests, nodes)
    return Candidates(tokens, parents, prob, valid)


def warmed_policy(fitted: bool = True, **config) -> AdaservePolicy:
    """The cost rule with a verify latency fitted (so the budget comes from the draft), or
    none yet (the configured budget, a host int)."""
    policy = AdaservePolicy(AdaserveConfig(**config))
    policy.observe_iteration(12.0)
    for tokens in (1, 2, 4, 8, 16, 32, 64) if fitted else ():
        policy.verify_latency.observe((tokens, 400), 8.0 + 0.3 * tokens)
    return policy


SLO_MIXES = {
    "best effort": lambda n: [math.nan] * n,
    "all tight": lambda n: [4.0] * n,
    "mixed": lambda n: [[4.0, 40.0, math.nan][i % 3] for i in range(n)],
}


@pytest.mark.parametrize("mix", SLO_MIXES)
@pytest.mark.parametrize("lead_floor, fitted", [(1.0, True), (0.3, True), (0.3, False)])
def test_the_decision_reads_nothing_of_the_draft_and_matches_the_host_one(mix, lead_floor, fitted):
    rng = random.Random(f"{mix}-{lead_floor}-{fitted}")
    policy = warmed_policy(fitted, lead_floor=lead_floor)
    for trial in range(6):
        requests, depth, width = rng.randint(1, 9), rng.randint(1, 5), rng.randint(1, 4)
        cands = beam_forest(rng, requests, depth, width)
        slo = SloBatch(
            tpot_slo_ms=torch.tensor(SLO_MIXES[mix](requests), dtype=torch.float64),
            decode_elapsed_ms=torch.tensor([rng.uniform(0, 400) for _ in range(requests)]),
            tokens_out=torch.tensor([float(rng.randint(0, 60)) for _ in range(requests)]),
        )
        rids = tuple(f"r{i}" for i in range(requests))
        context = sum(rng.randint(10, 900) for _ in range(requests))
        host = IterationInput(cands, slo, rids, context, depth, width)
        marked = Candidates.trusted(*(on_device(getattr(cands, name)) for name in FIELDS))
        device = IterationInput(marked, slo, rids, context, depth, width)
        on_host, on_dev = copy.deepcopy(policy), copy.deepcopy(policy)
        expected = on_host.decide(host)
        with HostReadCounter() as reads:
            decision = on_dev.decide(device)
        assert reads.count == 0, reads.sites
        assert decision.selection.mask.tolist() == expected.selection.mask.tolist(), trial
        assert int(decision.budget) == int(expected.budget)
        assert decision.calibrated_f.tolist() == expected.calibrated_f.tolist()
        assert decision.infeasible.tolist() == expected.infeasible.tolist()
