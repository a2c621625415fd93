"""adaserve on a server's draft: SGLang's verify tree holds the nodes its reranking kept of
every node the draft expanded, leaves its beam did not keep among them. The selection takes
them as candidates (no beam search between the draft and the verify); the gain table, read
after the verify, prices the drafted width by all of them, as the selection takes them, and
each narrower width by its beam searched in the tree."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from adaserve_inputs import beam, reranked_tree, slo, speculating_policy
from policy_inputs import iteration_input

from sgl_adaspec.speculative.adaserve import policy as policy_module
from sgl_adaspec.speculative.adaserve.config import AdaserveConfig
from sgl_adaspec.speculative.adaserve.gain_table import ShapeGain
from sgl_adaspec.speculative.adaserve.modes import Mode
from sgl_adaspec.speculative.selection import select_within
from sgl_adaspec.speculative.shapes import restrict_to_shape

DRAFT = (4, 2)  # the shape the draft ran: EAGLE steps 4, topk 2
NODES = 11  # --speculative-num-draft-tokens 12, the root aside


def _no_beam_search(*args, **kwargs):
    raise AssertionError("no beam search between the draft and the verify")


def _planned(tree):
    """A policy whose plan drafts DRAFT's shape for the tree's requests (every node of its
    drafts so far paid: the whole beam is worth verifying), and the iteration of `tree`."""
    requests = tree.num_requests
    policy = speculating_policy(AdaserveConfig())
    policy.plain_latency.seed([((n, 10), 10.0) for n in range(1, requests + 1)])
    policy.observe_iteration(12.0)
    policy.gain = ShapeGain(max_nodes=8)
    policy.gain.observe(beam([[[0.95, 0.9], [0.9, 0.85], [0.85, 0.8], [0.8, 0.75]]]), *DRAFT)
    policy.gain.refresh(lambda f: f)
    # The first request behind its SLO (the SLO phase serves it), the others best served by
    # the throughput phase.
    batch = slo([20.0, 40.0, 60.0][:requests], [100.0, 0.0, 90.0][:requests],
                [2.0, 0.0, 1.0][:requests])  # fmt: skip
    shape = policy.draft_shape(requests, *DRAFT, batch)
    assert policy.draft_state.mode is Mode.PLANNED and shape == DRAFT
    return policy, dataclasses.replace(iteration_input(tree, *DRAFT), slo=batch)


def test_the_selection_takes_every_node_sglang_drafted(monkeypatch):
    off_beam = 0
    for seed in range(12):
        rng = random.Random(seed)
        requests = rng.randint(1, 3)
        tree = reranked_tree(rng, requests, *DRAFT, NODES)
        beam = restrict_to_shape(tree, *DRAFT).valid
        policy, it = _planned(tree)
        k = policy._running_plan.nodes_per_request
        with monkeypatch.context() as patch:
            patch.setattr(policy_module, "restrict_to_shape", _no_beam_search)
            decision = policy.decide(it)
        exact = policy.acceptance.apply_exact(tree.path_prob)
        expected = select_within(
            tree.derived(path_prob=exact.float()), policy._slo_terms.demand,
            requests * k, -(-6 * k // 5),
        )  # fmt: skip
        assert torch.equal(decision.selection.mask, expected.mask), seed
        off_beam += int((decision.selection.mask & ~beam).sum())
    assert off_beam > 0  # the cases reach leaves a beam would have dropped


def _table(cands, width: int):
    gain = ShapeGain(max_nodes=8, max_depth=DRAFT[0], max_width=DRAFT[1])
    gain.observe(cands, DRAFT[0], width)
    gain.refresh(lambda f: f)
    return gain.table[[w == width for _, w in gain.shapes]]


@pytest.mark.parametrize("seed", range(4))
def test_the_gain_table_prices_the_drafted_width_by_every_node_and_narrower_ones_by_beams(seed):
    requests, depth = 3, DRAFT[0]
    tree = reranked_tree(random.Random(seed), requests, *DRAFT, NODES)
    drafted_beam = restrict_to_shape(tree, *DRAFT)
    assert not torch.equal(drafted_beam.valid, tree.valid)  # off-beam leaves
    gain = ShapeGain(max_nodes=8)
    gain.observe(tree, *DRAFT)
    gain.refresh(lambda f: f)
    drafted = gain.table[[w == DRAFT[1] for _, w in gain.shapes]]  # [depth, 9]
    # The drafted width: the batch's best 3 k nodes of depth <= d among all the tree's (each
    # request's best 8 pooled: the table's most nodes), per request, as the selection spends
    # a plan's budget on that draft.
    for d in range(1, depth + 1):
        f = torch.where(tree.depth <= d, tree.path_prob.double(), 0.0)
        pool = f.sort(dim=1, descending=True).values[:, :8].flatten()
        best = pool.sort(descending=True).values.cumsum(0)
        k = torch.arange(1, 9)
        expected = best[(requests * k - 1).clamp(max=len(best) - 1)] / requests
        assert drafted[d - 1, 1:].tolist() == pytest.approx(expected.tolist(), abs=1e-12)
    assert not torch.equal(drafted, _table(drafted_beam, DRAFT[1]))  # the leaves count
    # A narrower width: its beam, searched in the tree.
    chains = gain.table[[w == 1 for _, w in gain.shapes]]
    assert torch.equal(chains, _table(restrict_to_shape(tree, depth, 1), 1))
