"""adaserve's cost rule, calibrated acceptance and the one `observe` of an outcome, on
hand-computed cases."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections import Counter

import pytest
import torch
from policy_inputs import iteration_input

from sgl_adaspec.scheduler.slo import SloBatch
from sgl_adaspec.speculative.accept_calibration import AcceptanceCalibration
from sgl_adaspec.speculative.adaserve.config import AdaserveConfig
from sgl_adaspec.speculative.adaserve.gain_table import ShapeGain, pooled_gain
from sgl_adaspec.speculative.adaserve.knee_shape import AdaptiveTreeConfig
from sgl_adaspec.speculative.adaserve.planner import (
    THROUGHPUT_TIE,
    SloOutlook,
    cost_budget,
    plan_shape,
    speculation_pays,
)
from sgl_adaspec.speculative.adaserve.modes import (
    BLIND_AFTER,
    FIRST_REMEASURE,
    REMEASURE_PLAIN,
    REMEASURE_RUN,
)
from sgl_adaspec.speculative.adaserve.plan_reuse import PLAN_REUSE, same_batch
from sgl_adaspec.speculative.adaserve.policy import FLOOR_MEASUREMENTS, AdaservePolicy
from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.decision_log import DecisionLog
from sgl_adaspec.speculative.latency import VerifyLatency
from sgl_adaspec.speculative.policies.base import MAX_PLAIN_UNFITTED, make_outcome
from sgl_adaspec.speculative.shapes import draft_rows


def linear_ms(fixed: float, per_token: float):
    """verify_ms(tokens, context) = fixed + per_token * (tokens - 1)."""
    return lambda tokens, context=0: (
        fixed + per_token * (torch.as_tensor(tokens, dtype=torch.float64) - 1)
    )


def free_draft(steps, rows=1):
    return torch.zeros_like(torch.as_tensor(steps, dtype=torch.float64))


def beam(f_by_request: list[list[list[float]]]) -> Candidates:
    """A beam per request in level layout: f_by_request[r][level] lists that level's nodes'
    f (the same count at every level, best first); node i of a level hangs under node i of
    the level above."""
    tokens, parents, probs = [], [], []
    for levels in f_by_request:
        width = len(levels[0])
        parents.append(
            [
                -1 if lvl == 0 else (lvl - 1) * width + i
                for lvl in range(len(levels))
                for i in range(width)
            ]
        )
        probs.append([f for level in levels for f in level])
        tokens.append(list(range(len(probs[-1]))))
    return Candidates(
        tokens=torch.tensor(tokens), parents=torch.tensor(parents),
        path_prob=torch.tensor(probs, dtype=torch.float64),
        valid=torch.ones(len(tokens), len(tokens[0]), dtype=torch.bool),
    )  # fmt: skip


def flat_gain(per_node: float, depth: int, width: int, requests: int = 1) -> ShapeGain:
    """Every node of a depth x width beam has f = per_node: a shape's k best give per_node * k."""
    gain = ShapeGain(max_nodes=16)
    gain.observe(beam([[[per_node] * width] * depth] * requests), depth, width)
    gain.refresh(lambda f: f)
    return gain


def slo(
    tpot_ms: list[float], elapsed_ms: list[float] | None = None, tokens: list[float] | None = None
):
    n = len(tpot_ms)
    return SloBatch(
        torch.tensor(tpot_ms, dtype=torch.float64),
        torch.tensor(elapsed_ms or [0.0] * n, dtype=torch.float64),
        torch.tensor(tokens or [0.0] * n, dtype=torch.float64),
    )


def plan(gain, requests, verify, draft=free_draft, **kw):
    """The plan with a plain decode priced as a one-token-per-request verify unless given."""
    plain_ms = kw.pop("plain_ms", None) or float(verify(requests, 0))
    return plan_shape(
        slo=kw.pop("batch", None) or slo([math.nan] * requests), context_tokens=0, gain=gain,
        verify_ms=verify, draft_ms=draft, plain_ms=plain_ms, **kw,
    )  # fmt: skip


def drafted(policy, num_requests, steps, topk, slo_batch):
    """The policy's draft shape as the server adapter asks it: a plain one (depth 0) is then
    asked whether it keeps the draft's state, and goes stale where not (as the observe of that
    iteration's outcome would record; these tests feed no outcome)."""
    shape = policy.draft_shape(num_requests, steps, topk, slo_batch)
    if shape[0] == 0 and not policy.keep_draft_warm():
        policy.draft_state = policy.draft_state.observed(warm=False)
    return shape


def test_shape_gain_reads_every_smaller_shape_from_one_draft():
    # One request, a 2 x 2 beam: level 1 f = .8, .1; level 2 f = .6 (under .8), .05 (under .1).
    gain = ShapeGain(max_nodes=4)
    gain.observe(beam([[[0.8, 0.1], [0.6, 0.05]]]), 2, 2)
    gain.refresh(lambda f: f)
    assert gain.curve(1, 1).tolist() == pytest.approx([0, 0.8, 0.8, 0.8, 0.8])
    assert gain.curve(2, 1).tolist() == pytest.approx([0, 0.8, 1.4, 1.4, 1.4])  # the chain
    assert gain.curve(1, 2).tolist() == pytest.approx([0, 0.8, 0.9, 0.9, 0.9])
    assert gain.curve(2, 2).tolist() == pytest.approx([0, 0.8, 1.4, 1.5, 1.55])
    gain.refresh(lambda f: f.sqrt())  # a new calibration re-reads the kept draft
    assert gain.curve(2, 1)[2].item() == pytest.approx(0.8**0.5 + 0.6**0.5)
    # A later, narrower draft updates only the shapes it reached.
    gain.observe(beam([[[0.2], [0.1]]]), 2, 1)
    gain.refresh(lambda f: f)
    assert gain.curve(2, 1)[2].item() == pytest.approx((1.4 + 0.3) / 2)
    assert gain.curve(2, 2)[4].item() == pytest.approx(1.55)
    assert gain.curve(2, 2) is not None and gain.curve(3, 1) is None


def test_an_slo_outlook_counts_the_requests_a_pace_keeps_on_course_for_their_slo():
    # Brute force, request by request: q = elapsed / (tokens x SLO) (1 before a token), kept
    # if e SLO / W >= 1 / (2 - q), beyond recovery at q >= 2; with a spread, the normal
    # probability of the log margin. Two SLOs within one group, requests ahead of, on and
    # behind their pace and one past twice its SLO, one request left out of the group.
    torch.manual_seed(3)
    tpot = torch.tensor([50.0, 50.0, 50.0004, 50.0, 50.0004, 36.0], dtype=torch.float64)
    elapsed = torch.tensor([0.0, 900.0, 2000.0, 9000.0, 100.0, 700.0], dtype=torch.float64)
    tokens = torch.tensor([0.0, 30.0, 35.0, 80.0, 1.0, 3.0], dtype=torch.float64)
    members = torch.tensor([True, True, True, True, True, False])
    slo = SloBatch(tpot, elapsed, tokens)
    expected = 1.0 + 4.0 * torch.rand(5, 7, dtype=torch.float64)  # [S, K]
    wall = 20.0 + 200.0 * torch.rand(5, 7, dtype=torch.float64)
    normal = torch.distributions.Normal(0.0, 1.0)
    for spread in (0.0, 0.3):
        brute = torch.zeros_like(expected)
        for r in members.nonzero()[:, 0].tolist():
            q = elapsed[r] / (tokens[r] * tpot[r]) if tokens[r] > 0 else 1.0
            if q >= 2:
                continue  # request 3: 9000 ms for 80 tokens of 50 ms, beyond recovery
            margin = torch.log(expected * tpot[r] / wall) + math.log(2.0 - float(q))
            brute += (margin >= 0).double() if spread == 0 else normal.cdf(margin / spread)
        kept = SloOutlook.of(slo, members, spread).kept(expected, wall)
        assert torch.allclose(kept, brute, rtol=1e-9, atol=1e-9)
    assert len(SloOutlook.of(slo, members, 0.1).per_slo) == 2
    # A plain decode at 40 ms a token keeps request 1 (q = 0.6) on course; at 200 ms none.
    outlook = SloOutlook.of(slo, members, 0.0)
    assert outlook.kept_by(torch.full((1, 1), 40.0))
    assert not outlook.kept_by(torch.full((1, 1), 200.0))


def test_shape_gain_tables_are_the_pooled_gain_of_every_node_count():
    # Four requests, a 3 x 2 beam each (f falls along every path), two SLO groups; the table
    # holds up to 16 nodes per request, more than any shape has: past a shape's nodes its
    # gain stays at what all of them give. A group's table is its requests' share of the
    # batch's 4 k best nodes, per request of the group.
    torch.manual_seed(0)
    levels = torch.rand(4, 3, 2, dtype=torch.float64).sort(dim=2, descending=True).values
    levels = levels.cumprod(dim=1)
    gain = ShapeGain(max_nodes=16)
    gain.observe(beam(levels.tolist()), 3, 2, [1.0, 1.0, 2.0, 2.0])
    gain.refresh(torch.sqrt)
    for s, (depth, width) in enumerate(gain.shapes):
        ranked = levels[:, :depth, :width].reshape(4, -1).sqrt().sort(descending=True).values
        ranked = torch.nn.functional.pad(ranked, (0, 16 - ranked.shape[1]))  # [4, 16]
        owner = torch.arange(4).unsqueeze(1).expand(-1, 16).flatten()
        order = ranked.flatten().sort(descending=True, stable=True).indices
        for table, rows in ((gain.table, [0, 1, 2, 3]), (gain.group_table(2.0), [2, 3])):
            mine = torch.isin(owner[order], torch.tensor(rows))
            best = torch.where(mine, ranked.flatten()[order], 0.0).cumsum(0)
            expected = best[torch.arange(1, 17) * 4 - 1] / len(rows)
            assert table[s, 1:].tolist() == pytest.approx(expected.tolist(), abs=1e-12)
            assert table[s, -1].item() == pytest.approx(float(ranked[rows].sum()) / len(rows))


def test_shape_gain_keeps_a_shape_the_kept_drafts_no_longer_reach():
    # Two drafts kept: a 2 x 2 one, then two 1 x 1 chains. The wide, deep shapes keep what the
    # first returned (else the plan could not choose them again until the next exploring
    # draft); the shapes the chains reached read the chains.
    gain = ShapeGain(max_nodes=4, drafts=2)
    gain.observe(beam([[[0.8, 0.1], [0.6, 0.05]]]), 2, 2)
    gain.refresh(lambda f: f)
    for _ in range(2):
        gain.observe(beam([[[0.4]]]), 1, 1)
        gain.refresh(lambda f: f)
    assert gain.curve(2, 2).tolist() == pytest.approx([0, 0.8, 1.4, 1.5, 1.55])
    assert gain.curve(2, 1).tolist() == pytest.approx([0, 0.8, 1.4, 1.4, 1.4])
    assert gain.curve(1, 1).tolist() == pytest.approx([0, 0.4, 0.4, 0.4, 0.4])


def test_shape_gain_reuses_a_drafts_gains_under_the_same_fit():
    """A refresh under a named fit computes only the drafts new since that fit; under a new
    fit (or none) every kept draft is recalibrated."""
    gain = ShapeGain(max_nodes=2)
    gain.observe(beam([[[0.8]]]), 1, 1)
    gain.refresh(lambda f: f, fit=1)
    assert gain.curve(1, 1).tolist() == pytest.approx([0, 0.8, 0.8])
    gain.observe(beam([[[0.4]]]), 1, 1)
    gain.refresh(lambda f: f / 2, fit=1)  # the first draft keeps its gains: 0.8, the new 0.2
    assert gain.curve(1, 1).tolist() == pytest.approx([0, 0.5, 0.5])
    gain.refresh(lambda f: f / 2, fit=2)  # both under the new fit: 0.4 and 0.2
    assert gain.curve(1, 1).tolist() == pytest.approx([0, 0.3, 0.3])
    gain.refresh(lambda f: f)  # unnamed: recomputed
    assert gain.curve(1, 1).tolist() == pytest.approx([0, 0.6, 0.6])


def test_shape_gain_keeps_a_bounded_sample_of_a_large_batch():
    """Past `max_rows` requests a draft is kept for an evenly spread sample of them, from an
    offset that turns draft by draft, so the table costs the same at any batch size."""
    gain = ShapeGain(max_nodes=1, max_rows=3)
    six = beam([[[0.1 * (r + 1)]] for r in range(6)])  # request r's one node: f = 0.1 (r + 1)
    gain.observe(six, 1, 1, groups=[20.0, 50.0] * 3)  # requests 0, 2, 4: all of group 20
    gain.refresh(lambda f: f)
    assert gain.curve(1, 1)[1].item() == pytest.approx((0.1 + 0.3 + 0.5) / 3)
    assert gain.group_table(50.0) is gain.table  # group 50 not sampled yet
    gain.observe(six, 1, 1, groups=[20.0, 50.0] * 3)  # requests 1, 3, 5
    gain.refresh(lambda f: f)
    assert gain.curve(1, 1)[1].item() == pytest.approx(0.35)  # all six, once each
    assert gain.group_table(50.0)[0, 1].item() == pytest.approx(0.4)


def test_shape_gain_keeps_a_table_per_slo_group():
    gain = ShapeGain(max_nodes=2)
    gain.observe(beam([[[0.9], [0.8]], [[0.3], [0.1]]]), 2, 1, groups=[20.0, None])
    gain.refresh(lambda f: f)
    # Group 20's request takes both of the batch's best two nodes (.9, .8) at one node per
    # request: the selection ranks the whole batch.
    assert gain.group_table(20.0)[1].tolist() == pytest.approx([0, 1.7, 1.7])
    # All requests: one node each is the batch's best two (.9, .8) over two requests.
    assert gain.group_table(None)[1].tolist() == pytest.approx([0, 0.85, 1.05])
    assert gain.group_table(50.0) is gain.table  # a group never seen reads the batch's


def test_shape_gain_pools_by_the_weight_the_selection_ranks_by():
    """With a rank weight per request the pool is ordered by f x weight, as the throughput
    phase orders nodes, while what a node returns stays its f: a request weighed down gets
    fewer of the batch's nodes."""
    chains = [[[0.9], [0.8], [0.7]], [[0.6], [0.5], [0.3]]]
    plain, weighed = ShapeGain(max_nodes=3), ShapeGain(max_nodes=3)
    plain.observe(beam(chains), 3, 1, groups=[20.0, 50.0])
    weighed.observe(beam(chains), 3, 1, groups=[20.0, 50.0], rank_weight=torch.tensor([0.5, 1]))
    plain.refresh(lambda f: f)
    weighed.refresh(lambda f: f)
    # By f: .9 .8 | .7 .6 | .5 .3 (two nodes per k). By f x w: .6 .5 | .45 .4 | .35 .3, so
    # k = 1 verifies the second request's .6 and .5, k = 2 adds the first's .9 and .8.
    assert plain.curve(3, 1).tolist() == pytest.approx([0, 0.85, 1.5, 1.9])
    assert weighed.curve(3, 1).tolist() == pytest.approx([0, 0.55, 1.4, 1.9])
    assert weighed.group_table(20.0)[2].tolist() == pytest.approx([0, 0, 1.7, 2.4])
    assert weighed.group_table(50.0)[2].tolist() == pytest.approx([0, 1.1, 1.1, 1.4])


def test_shape_gain_is_what_a_batch_wide_budget_of_k_nodes_per_request_returns():
    # Two requests, 3-deep chains: one the draft reads well (.9, .8, .7), one it does not
    # (.2, .1, .05). k nodes per request spent batch-wide (as cost_budget and the throughput
    # phase spend them) take the easy chain first: k = 1 verifies .9 and .8, not .9 and .2.
    gain = ShapeGain(max_nodes=3)
    gain.observe(beam([[[0.9], [0.8], [0.7]], [[0.2], [0.1], [0.05]]]), 3, 1)
    gain.refresh(lambda f: f)
    assert gain.curve(3, 1).tolist() == pytest.approx([0, 0.85, 1.3, 1.375])
    # Each request's own k best would give (.9 + .2) / 2 = .55 at k = 1: pooling returns more
    # where requests differ, and the same where they do not.
    assert pooled_gain(torch.tensor([[[0.9, 0.9, 0.8, 0.8]]]), torch.tensor([2]), 2).tolist() == [
        [pytest.approx([0.9, 1.7])]
    ]
    # Pools of drafts with 2 and 1 requests, the first cut after its last node of f' > 0 (more
    # nodes per request return nothing more), the second padded with zeros.
    pools = torch.tensor([[[0.9, 0.5, 0.0]], [[0.6, 0.2, 0.0]]])
    assert pooled_gain(pools, torch.tensor([2, 1]), 3).tolist() == [
        [pytest.approx([0.7] * 3)],
        [pytest.approx([0.6, 0.8, 0.8])],
    ]
    assert pooled_gain(torch.zeros(1, 2, 0), torch.tensor([3]), 2).tolist() == [[[0.0] * 2] * 2]


def test_tokens_costing_more_than_they_return_give_no_speculation():
    # One more verified token costs as much as a whole decode (10 ms) and returns 0.9 tokens:
    # rate(k) = (1 + 0.9 k) / (10 (1 + k)) < 1 / 10 for every k >= 1.
    choice = plan(flat_gain(0.9, 4, 2), 1, linear_ms(10.0, 10.0))
    assert choice.depth == 0 and choice.plain_tokens_per_ms == pytest.approx(0.1)


def test_a_flat_cost_curve_gives_the_full_tree():
    choice = plan(flat_gain(0.5, 4, 2, requests=4), 4, linear_ms(10.0, 0.0))
    assert (choice.depth, choice.width) == (4, 2)
    assert choice.nodes_per_request == 8  # every node of the 4 x 2 beam
    assert choice.tokens_per_ms == pytest.approx(4 * (1 + 0.5 * 8) / 10.0)


def test_a_plain_decode_is_priced_at_what_it_measured():
    # Verify passes seen at 8 and 16 tokens (80, 100 ms) put one token at 62.5 ms on their
    # line; a 4 x 2 beam of f = 0.9 then returns 1 + 7.2 tokens per 82.5 ms = .099 per ms,
    # 6x a plain decode's 1 / 62.5. Measured, a plain decode takes 10 ms: .1 per ms, and wins.
    verify = lambda tokens, context=0: 60.0 + 2.5 * torch.as_tensor(tokens, dtype=torch.float64)
    assert plan(flat_gain(0.9, 4, 2), 1, verify).depth > 0
    assert plan(flat_gain(0.9, 4, 2), 1, verify, plain_ms=10.0).depth == 0


def test_a_switch_to_speculation_needs_its_margin():
    # One node of f = 0.5 for 4 ms more verify: 1.5 / 14 = .107 per ms, 7 % over a plain 0.1.
    assert plan(flat_gain(0.5, 1, 1), 1, linear_ms(10.0, 4.0)).depth == 1
    assert plan(flat_gain(0.5, 1, 1), 1, linear_ms(10.0, 4.0), margin=0.1).depth == 0


def test_draft_cost_decides_against_a_modest_gain():
    # Verify is free past the first token, but drafting costs 6 ms per step: depth 1 gives
    # (1 + 0.5) / (10 + 6) < 1 / 10, deeper is worse still.
    six_per_step = lambda steps, rows: 6.0 * torch.as_tensor(steps, dtype=torch.float64)
    choice = plan(flat_gain(0.5, 3, 1), 1, linear_ms(10.0, 0.0), six_per_step)
    assert choice.depth == 0


def test_a_wide_beam_must_pay_for_its_draft_rows():
    # 4 requests, each a 2 x 2 beam whose second branch is nearly worthless; verify 10 ms flat.
    gain = ShapeGain(max_nodes=4)
    gain.observe(beam([[[0.8, 0.05], [0.64, 0.01]]] * 4), 2, 2)
    gain.refresh(lambda f: f)
    # Rows cost 0.5 ms: chain (2, 1), 8 rows: 4 x 2.44 / 14 = .697 per ms; the full beam,
    # 12 rows: 4 x 2.5 / 16 = .625; depth 1 (4 rows whatever the width): 4 x 1.85 / 12 = .617.
    half_per_row = lambda steps, rows: 0.5 * torch.as_tensor(rows, dtype=torch.float64)
    choice = plan(gain, 4, linear_ms(10.0, 0.0), half_per_row)
    assert (choice.depth, choice.width, choice.nodes_per_request) == (2, 1, 2)
    # With rows free, the side branch's 0.06 tokens are worth having.
    assert (
        plan(gain, 4, linear_ms(10.0, 0.0)).width,
        plan(gain, 4, linear_ms(10.0, 0.0)).nodes_per_request,
    ) == (2, 4)


def test_the_plan_is_no_wider_than_the_load_adaptive_width():
    # The batch of the test above with draft rows free: the side branches are worth their
    # verify, and the 2 x 2 beam is the plan. Capped at width 1 (eq. 9's width where the batch
    # is large), the plan is the chain, at the node count the chain pays for.
    gain = ShapeGain(max_nodes=4)
    gain.observe(beam([[[0.8, 0.05], [0.64, 0.01]]] * 4), 2, 2)
    gain.refresh(lambda f: f)
    assert plan(gain, 4, linear_ms(10.0, 0.0)).width == 2
    choice = plan(gain, 4, linear_ms(10.0, 0.0), max_width=1)
    assert (choice.depth, choice.width, choice.nodes_per_request) == (2, 1, 2)
    assert plan(gain, 4, linear_ms(10.0, 0.0), max_width=2).width == 2


def test_adaserve_plans_within_the_load_adaptive_width():
    # Verify nearly free past the root and a cheap draft: at 1 request the 4 x 2 beam pays
    # (eq. 9's width, B2 / n = 64, is past the draft's top-k). With B2 = 4 the same policy at 8
    # requests may draft no wider than 4 // 8 -> 1: a chain.
    def planned(draft_tokens_per_step: int, requests: int) -> tuple[int, int]:
        tree = AdaptiveTreeConfig(draft_tokens_per_step=draft_tokens_per_step)
        policy = AdaservePolicy(AdaserveConfig(tree=tree))
        policy.verify_latency.seed([((requests, 10), 10.0), ((9 * requests, 10), 10.5)])
        policy.plain_latency.seed([((requests, 10), 10.0)])
        policy.gain = flat_gain(0.5, 4, 2, requests=requests)
        policy.draft_latency.seed([((1, requests), 0.1), ((4, 7 * requests), 0.2)])
        return drafted(policy, requests, 4, 2, slo([math.nan] * requests))

    assert planned(64, 1) == (4, 2)
    assert planned(64, 8) == (4, 2)
    assert planned(4, 8) == (4, 1)


def test_speed_goes_to_the_requests_whose_slo_it_decides():
    """r0 (SLO 20 ms) has a draft that is almost always right, r1 (SLO 12 ms) one that never
    is (f ~ 0: a draft's f is never exactly 0; rows of zeros are requests blind to it).
    Verify: 10 ms + 2 ms per extra token, draft free. Both are new (a TPOT so far of their
    SLO: kept on course while an iteration gives them a token per SLO). A plain decode: 12
    ms, both kept, 2 + the tie-break's 0.01. A 1-node chain each: 16 ms, more tokens in all
    (2.95 / 16 > 2 / 12), but r1 falls to 16 ms per token, off course and slower than a
    plain decode would serve it: the plan stays plain."""
    gain = ShapeGain(max_nodes=4)
    gain.observe(beam([[[0.95]] * 4, [[1e-9]] * 4]), 4, 1, groups=[20.0, 12.0])
    gain.refresh(lambda f: f)
    choice = plan(gain, 2, linear_ms(10.0, 2.0), batch=slo([20.0, 12.0]))
    assert choice.depth == 0
    assert choice.plain_objective == pytest.approx(2 + THROUGHPUT_TIE)
    # Without SLOs the same batch speculates: throughput is all that counts.
    assert plan(gain, 2, linear_ms(10.0, 2.0)).depth > 0


def test_a_request_a_plain_decode_would_lose_does_not_hold_the_others_back():
    """r0 (SLO 15 ms) has a draft that is always right (f = 0.95 at every level), r1 (SLO 5
    ms) one that never is; both new. Verify: 10 ms + 2 ms per extra token, draft free; a
    plain decode 12 ms keeps r0 on course (15 / 12 >= 1) and not r1 (5 / 12): it scores 1 +
    0.01. The batch-wide ranking gives r0 the nodes: k = 2 per request verifies r0's four
    (r0 4.8 tokens, r1 1) in 20 ms, 5.8 / 20 = 1.74x a plain decode's 2 / 12 tokens per ms,
    the most of any shape and count (k = 1: 3.9 / 16 = 1.46x; a 3-deep chain at k = 2: 4.85
    / 20). r0 stays kept; r1, off course either way, gets 1 token per 20 ms, slower than a
    plain decode's 12: it does not guard the plan, so the plan speculates, scoring 1 +
    0.0174."""
    gain = ShapeGain(max_nodes=4)
    gain.observe(beam([[[0.95]] * 4, [[1e-9]] * 4]), 4, 1, groups=[15.0, 5.0])
    gain.refresh(lambda f: f)
    choice = plan(gain, 2, linear_ms(10.0, 2.0), batch=slo([15.0, 5.0]))
    assert (choice.depth, choice.width, choice.nodes_per_request) == (4, 1, 2)
    assert choice.iteration_ms == pytest.approx(20.0)
    assert choice.expected_accepted == pytest.approx(5.8 / 2)
    assert choice.objective == pytest.approx(1 + THROUGHPUT_TIE * 5.8 / 20 * 12 / 2)
    assert choice.plain_objective == pytest.approx(1 + THROUGHPUT_TIE)


def test_no_request_a_plain_decode_keeps_on_course_is_slowed_down_to_speed_up_another():
    """r0 (SLO 5 ms) has a draft that is almost always right, r1 (SLO 14 ms) one that never
    is. Verify: 10 ms + 2 ms per extra token, draft free; plain decode 12 ms, which keeps r1 on
    course (14 / 12 >= 1) and not r0. Speculation would serve r0 well (a 1-node chain each, 16
    ms: twice as fast), but r1 would get 1 token per 16 ms or more, off its SLO: the plan stays
    plain, scoring r1 kept and the tie-break, 1.01."""
    gain = ShapeGain(max_nodes=4)
    gain.observe(beam([[[0.95]] * 4, [[1e-9]] * 4]), 4, 1, groups=[5.0, 14.0])
    gain.refresh(lambda f: f)
    choice = plan(gain, 2, linear_ms(10.0, 2.0), batch=slo([5.0, 14.0]))
    assert choice.depth == 0
    assert choice.plain_objective == pytest.approx(1 + THROUGHPUT_TIE)
    # With r1's draft as good as r0's, both gain and the plan speculates.
    good = ShapeGain(max_nodes=4)
    good.observe(beam([[[0.95]] * 4, [[0.95]] * 4]), 4, 1, groups=[5.0, 14.0])
    good.refresh(lambda f: f)
    assert plan(good, 2, linear_ms(10.0, 2.0), batch=slo([5.0, 14.0])).depth > 0


def test_the_switch_margin_is_the_batchs_and_a_groups_own_guard_its_prediction_error():
    """r0 (SLO 5 ms, out of reach of a plain decode: unguarded) has a draft of f = 0.95, r1
    (SLO 12.5 ms, kept by a plain decode: guarded) one of f = x; a 1-node chain each verifies
    4 tokens in 16 ms against a plain decode's 2 in 12 ms. r1 then gets (1 + x) x 12 / 16 of a
    plain decode's tokens per ms, a pace too near its SLO to be slowed (log 12.5 / 11.1 < the
    headroom log 1.16). From a plain iteration the batch must gain the switch margin (0.16 here)
    while r1 must only not lose what plans have fallen short (the guard margin, 0.054):
    holding r1 to 0.16 too stood a batch 1.3x faster down (simulator, the rps4.8 trace at
    1.5x, coding 1.2x, seed 0: chat at 1.14x barred 61 iterations at 48+ running)."""

    def gain_with(x: float) -> ShapeGain:
        gain = ShapeGain(max_nodes=1)
        gain.observe(beam([[[0.95]], [[x]]]), 1, 1, groups=[5.0, 12.5])
        gain.refresh(lambda f: f)
        return gain

    def depth(x: float, **margins) -> int:
        batch = slo([5.0, 12.5])
        return plan(gain_with(x), 2, linear_ms(10.0, 2.0), batch=batch, **margins).depth

    margins = {"margin": 0.16, "guard_margin": 0.054}
    # x = 0.44: r1 at 1.08x, the batch (1.95 + 1.44) / 16 x 6 = 1.27x.
    assert depth(0.44, **margins) == 1
    assert depth(0.44, margin=0.16) == 0  # the guard margin defaults to the margin
    # x = 0.38: r1 at 1.035x, short of its own guard however fast the batch (1.25x).
    assert depth(0.38, **margins) == 0
    assert depth(0.38, margin=0.16, guard_margin=0.0) == 1
    # r0's draft at f = 0.5: the batch at (1.5 + 1.44) / 16 x 6 = 1.10x, short of the switch
    # margin: r1 holds the plan plain, as before.
    weak = ShapeGain(max_nodes=1)
    weak.observe(beam([[[0.5]], [[0.44]]]), 1, 1, groups=[5.0, 12.5])
    weak.refresh(lambda f: f)
    batch = slo([5.0, 12.5])
    assert plan(weak, 2, linear_ms(10.0, 2.0), batch=batch, **margins).depth == 0
    assert plan(weak, 2, linear_ms(10.0, 2.0), batch=batch, margin=0.054).depth == 1


def test_a_request_far_inside_its_slo_may_be_slowed_while_it_stays_on_course():
    """As above, but r1's SLO is 100 ms: at 1 token per 20 ms (a 4-deep chain, k = 2) it is
    slower than a plain decode would serve it, and still far inside its SLO. Standing down for
    it served every other request plain under overload (simulator, the rps4.8 trace at 1.5x,
    seed 0: summarization guarded every plan down for ~360 iterations; 75 % of SLOs met,
    where speculation met 88 %). The plan speculates and keeps both r0 and r1. With the
    iterations' wall time spread so that r1's pace could fall below what it needs (the
    `GUARD_SIGMAS` headroom), the plan guards r1 again."""
    gain = ShapeGain(max_nodes=4)
    gain.observe(beam([[[0.95]] * 4, [[1e-9]] * 4]), 4, 1, groups=[5.0, 100.0])
    gain.refresh(lambda f: f)
    choice = plan(gain, 2, linear_ms(10.0, 2.0), batch=slo([5.0, 100.0]))
    assert (choice.depth, choice.nodes_per_request, choice.iteration_ms) == (4, 2, 20.0)
    assert choice.objective == pytest.approx(2 + THROUGHPUT_TIE * 5.8 / 20 * 12 / 2)
    # r1's pace there is 100 / 20 = 5x what it needs (log 1.61 of room), at the shortest
    # speculative iteration (16 ms) 6.25x (log 1.83): a spread of 0.7 asks 1.4 of room, one
    # of 1.0 asks 2.
    spread = plan(gain, 2, linear_ms(10.0, 2.0), batch=slo([5.0, 100.0]), spread=0.7)
    assert (spread.depth, spread.nodes_per_request) == (4, 2)
    assert plan(gain, 2, linear_ms(10.0, 2.0), batch=slo([5.0, 100.0]), spread=1.0).depth == 0


def test_cost_budget_stops_where_the_rate_peaks():
    # f' = 0.9, 0.5, 0.1; verify 10 ms + 2 ms per extra token; draft already paid.
    # m = 0: 1/10 = .100, m = 1: 1.9/12 = .158, m = 2: 2.4/14 = .171, m = 3: 2.5/16 = .156.
    f = torch.tensor([[0.9, 0.5, 0.1]])
    budget = cost_budget(f, torch.ones_like(f, dtype=torch.bool), 0.0, 0, linear_ms(10.0, 2.0))
    assert budget == 3  # the root and two draft nodes


def test_cost_budget_with_unknown_latency_is_none():
    f = torch.tensor([[0.9]])
    assert cost_budget(f, torch.ones_like(f, dtype=torch.bool), 0.0, 0, lambda *a: None) is None


def test_calibration_learns_an_overconfident_draft():
    calibration = AcceptanceCalibration(prior_weight=1.0)
    # A chain of two nodes with f = 0.8, 0.64; the target accepts the first half the time and
    # the second never.
    f = torch.tensor([[0.8, 0.64]])
    for i in range(200):
        calibration.observe(f, torch.tensor([[i % 2 == 0, False]]))
    assert calibration.apply(torch.tensor([0.8])).item() == pytest.approx(0.5, abs=0.03)
    assert calibration.apply(torch.tensor([0.64])).item() == pytest.approx(0.0, abs=0.03)
    assert calibration.apply(torch.tensor([0.0])).item() == 0.0
    # The sum it predicts for the verified nodes is what was accepted.
    assert calibration.calibrated_sum(f) == pytest.approx(0.5, abs=0.05)


def test_calibration_learns_an_underconfident_chain():
    """A chain always accepted whose draft gives each step 0.3: f = 0.3, 0.09, 0.027, 0.0081.
    Every depth maps to 1 (no single power or factor of f would do that)."""
    calibration = AcceptanceCalibration()
    chain = torch.tensor([[0.3, 0.09, 0.027, 0.0081]])
    for _ in range(300):
        calibration.observe(chain, torch.ones_like(chain, dtype=torch.bool))
    assert calibration.calibrated_sum(chain) == pytest.approx(4.0, rel=0.05)
    assert calibration.apply(chain).min().item() > 0.95


def test_calibration_map_never_decreases_in_f():
    calibration = AcceptanceCalibration(prior_weight=0.5)
    # Noisy and non-monotone evidence: f = 0.5 accepted more often than f = 0.7.
    for i in range(100):
        calibration.observe(torch.tensor([[0.7, 0.5]]), torch.tensor([[i % 4 == 0, i % 4 != 3]]))
    f = torch.linspace(0.0, 1.0, 101)
    g = calibration.apply(f)
    assert (g[1:] >= g[:-1] - 1e-12).all()
    assert 0.4 < calibration.apply(torch.tensor([0.6])).item() < 0.6  # 0.25 and 0.75 pooled


def test_one_weak_verify_does_not_zero_the_calibration():
    """A first verify of one request whose 32 nodes read f = 0.01 or so (0.32 in all) and are
    all rejected is what a calibrated draft does two times in three. Read as an overall error
    of 0, g was 0 at every f, no node was worth verifying, and no verify could show otherwise
    again. Now the error is pulled toward 1 and g above the bins seen follows it."""
    calibration = AcceptanceCalibration()
    calibration.observe(torch.full((1, 32), 0.01), torch.zeros((1, 32), dtype=torch.bool))
    high = calibration.apply(torch.tensor([0.9])).item()
    scale = (0 + 1.0) / (0.32 + 1.0)  # bias_prior = 1 pseudo-success and as much f
    assert high == pytest.approx(scale * (0.9 - 0.01) / (1 - 0.01) + 0.0, abs=0.01)
    assert calibration.apply(torch.tensor([0.01])).item() < 0.001  # 32 misses at f = 0.01
    # Evidence still wins: the same weak verify 300 times (decayed: ~16 of f, no success) reads
    # an error of 1 / 17 at every f.
    for _ in range(300):
        calibration.observe(torch.full((1, 32), 0.01), torch.zeros((1, 32), dtype=torch.bool))
    assert calibration.apply(torch.tensor([0.9])).item() == pytest.approx(0.9 / 17, abs=0.005)


def test_calibration_above_the_bins_seen_follows_the_overall_error():
    calibration = AcceptanceCalibration()
    # A draft accepted half as often as it says, seen at f = 0.2 only.
    f = torch.tensor([[0.2, 0.2, 0.2, 0.2, 0.2]])
    for i in range(400):
        calibration.observe(f, torch.tensor([[i % 2 == 0, False, False, False, False]]))
    assert calibration.apply(torch.tensor([0.2])).item() == pytest.approx(0.1, abs=0.01)
    # Linear from the last bin (0.2, 0.1) to (1, 0.5).
    assert calibration.apply(torch.tensor([0.6])).item() == pytest.approx(0.3, abs=0.01)
    g = calibration.apply(torch.linspace(0.0, 1.0, 101))
    assert (g[1:] >= g[:-1] - 1e-12).all()


def test_calibration_without_observations_is_the_identity():
    calibration = AcceptanceCalibration()
    f = torch.tensor([0.9, 0.2, 0.0])
    assert calibration.apply(f).tolist() == pytest.approx(f.tolist(), abs=0.02)


def feed(
    policy: AdaservePolicy,
    verify_ms: float,
    iteration_ms: float,
    accepted: int,
    requests: int = 1,
    after_prefill: bool = False,
    draft_kept: bool = False,
) -> None:
    """One plain iteration (no decision: verified 1 token each) of `requests` requests."""
    outcome = make_outcome(
        None, None, rids=tuple(f"r{i}" for i in range(requests)), context_tokens=10 * requests,
        accepted=torch.full((requests,), accepted), verify_ms=verify_ms, iteration_ms=iteration_ms,
        after_prefill=after_prefill, draft_kept=draft_kept,
    )  # fmt: skip
    policy.observe(outcome)


def test_adaserve_stands_down_then_probes():
    policy = AdaservePolicy(AdaserveConfig(probe_interval=3))
    one = slo([math.nan])
    # Measured: a 1-token verify 10 ms, 8 tokens 80 ms (every token a full decode's price).
    policy.verify_latency.seed([((1, 10), 10.0), ((8, 10), 80.0)])
    policy.plain_latency.seed([((1, 10), 10.0)])
    policy.gain = flat_gain(0.5, 4, 2)
    assert drafted(policy, 1, 4, 2, one) == (4, 2)  # no draft cost measured: the full shape
    policy.draft_latency.seed([((1, 1), 2.0), ((4, 7), 8.0)])
    shapes = [drafted(policy, 1, 4, 2, one) for _ in range(9)]
    # 3 plain iterations, a probe (a cold depth-1 chain, then a full draft), plain again.
    assert [d for d, _ in shapes[:3]] == [0, 0, 0]
    assert shapes[3] == (1, 1) and shapes[4] == (4, 2)
    assert [d for d, _ in shapes[5:]] == [0, 0, 0, 0]  # the next probe waits twice as long
    assert policy.stats.last_plan["speculate"] is False
    assert policy.stats.last_plan["requests"] == 1  # the load it was made for
    # Coming from plain iterations, with no track record yet, a switch asks the switch margin.
    assert policy.stats.last_plan["required_gain"] == pytest.approx(policy.config.switch_margin)
    # /server_info names why each speculative iteration ran.
    assert policy.stats.speculation_reasons == {"unplanned": 1, "probe": 2}


def standing_down_policy(probe_interval: int) -> AdaservePolicy:
    """Measured: plain 10 ms; a speculative iteration (draft 2-8 ms + verify) does not pay."""
    policy = AdaservePolicy(AdaserveConfig(probe_interval=probe_interval))
    policy.verify_latency.seed([((1, 10), 10.0), ((8, 10), 80.0)])
    policy.plain_latency.seed([((1, 10), 10.0), ((2, 10), 10.0)])
    policy.gain = flat_gain(0.5, 4, 2)
    policy.draft_latency.seed([((1, 1), 2.0), ((4, 7), 8.0)])
    return policy


def test_adaserve_probes_only_when_no_request_on_track_would_lose_its_slo():
    # Two requests with a 12 ms SLO, 100 tokens out: one 30 ms ahead of its track, one behind.
    tight = slo([12.0, 12.0], elapsed_ms=[1170.0, 1300.0], tokens=[100.0, 100.0])
    policy = standing_down_policy(probe_interval=2)
    standing = policy._cost_plan(tight)
    assert [drafted(policy, 2, 4, 2, tight)[0] for _ in range(6)] == [0] * 6
    state = policy.draft_state
    assert state.plain_run >= state.probe_every  # the probe was due, and deferred
    # The probe is priced as the shapes it runs: a cold 1-deep chain, then the full 4 x 2
    # search (draft + a verify of 1 + depth tokens per request, less a plain decode, each).
    cost = policy._probe_cost_ms(2, standing, (4, 2), stale=state.stale)
    assert state.stale
    by_hand = sum(
        policy.verify_latency.predict((2 * (1 + d), policy._context_tokens))
        + policy.draft_latency.predict((d, draft_rows(d, w, 2)))
        - standing.plain_ms
        for d, w in ((1, 1), (4, 2))
    )
    assert cost == pytest.approx(by_hand) and cost > 30.0  # the first would fall off its track
    # Slack just short of what the probe's shapes cost: it still waits.
    short = slo([12.0, 12.0], elapsed_ms=[1200.0 - cost + 1.0, 1300.0], tokens=[100.0, 100.0])
    assert drafted(policy, 2, 4, 2, short)[0] == 0
    # With the slack to pay for it (and the other still behind: it does not block), it probes.
    roomy = slo([12.0, 12.0], elapsed_ms=[1200.0 - cost - 1.0, 1300.0], tokens=[100.0, 100.0])
    assert drafted(policy, 2, 4, 2, roomy) == (1, 1)  # the probe's cold chain


def test_a_few_planned_iterations_after_a_probe_do_not_restart_its_backoff():
    """After a probe the plan may speculate for a few iterations (the probe's draft lifted the
    gain table) and stand down again: the next probe still waits twice as long. Planned
    speculation that holds for a probe interval is a new regime: the base rate again."""
    policy = standing_down_policy(probe_interval=3)
    one = slo([math.nan])
    standing = policy._cost_plan(one)
    speculating = dataclasses.replace(standing, depth=2, width=1, nodes_per_request=2)
    plans = []  # the plans of the coming iterations; then a stand-down
    policy._cost_plan = lambda slo_batch, plain_ms=None: plans.pop(0) if plans else standing

    def depths(count: int) -> list[int]:
        return [drafted(policy, 1, 4, 2, one)[0] for _ in range(count)]

    assert depths(5) == [0, 0, 0, 1, 4]  # plain for the interval (3), then a probe
    plans[:] = [speculating] * 2  # a short-lived plan to speculate
    assert depths(2) == [2, 2]
    # Standing down again, the probe waits 6 (twice 3), not 3.
    assert depths(8) == [0, 0, 0, 0, 0, 0, 1, 4]
    plans[:] = [speculating] * 3  # speculation that holds for the interval
    assert depths(3) == [2, 2, 2]
    assert depths(5) == [0, 0, 0, 1, 4]  # the base rate
    reasons = policy.stats.speculation_reasons
    assert reasons == {"probe": 6, "planned": 5}


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


def speculating_policy(config: AdaserveConfig) -> AdaservePolicy:
    policy = AdaservePolicy(config)
    policy.verify_latency.seed([((1, 10), 10.0), ((3, 10), 10.0)])  # verify is flat
    policy.plain_latency.seed([((1, 10), 10.0)])
    policy.draft_latency.seed([((1, 1), 1.0), ((4, 7), 4.0)])  # 1 ms per step
    # The chain is as good as the tree and 2 deep is where the rate peaks: (1 + 1.6) / 12.
    gain = ShapeGain(max_nodes=8)
    gain.observe(beam([[[0.8, 0.0], [0.8, 0.0], [0.05, 0.0], [0.05, 0.0]]]), 4, 2)
    gain.refresh(lambda f: f)
    policy.gain = gain
    return policy


def observe_drafts(policy, requests: int, drafts) -> None:
    """Speculative iterations of `requests` requests whose every beam node has f = 0.5, each
    (steps, width, draft ms) with a 10 ms verify that accepted every node of the chain."""
    for steps, width, draft_ms in drafts:
        beams = beam([[[0.5] * width] * steps] * requests)
        it = iteration_input(beams, steps, width, context_len=10)
        policy.observe(
            make_outcome(
                it, policy.decide(it), rids=it.rids, context_tokens=10 * requests,
                accepted=torch.full((requests,), steps + 1), verify_ms=10.0,
                iteration_ms=10.0 + draft_ms,
            )
        )  # fmt: skip


def test_adaserve_measures_the_draft_at_a_new_load_where_its_extrapolation_decides():
    """Drafted at one request alone, a 4 x 2 beam (7 rows) and a depth-1 chain (1 row) put the
    draft's steps and rows on one line, and the fit credits the rows: at 8 requests it prices
    the 4 x 2 beam (56 rows) at ~122 ms where a step costs what it cost at one request (30 ms
    in all), and the plan stands down. Priced as at one request the beam would pay, so a probe
    measures it there, outside the probes' backoff; measured, the plan speculates."""
    policy = AdaservePolicy(AdaserveConfig())
    policy.verify_latency.seed([((1, 10), 10.0), ((40, 80), 12.0)])
    policy.plain_latency.seed([((1, 10), 10.0), ((8, 80), 12.0)])
    observe_drafts(policy, 1, [(4, 2, 30.0), (1, 1, 10.0)] * 2)
    assert policy.draft_latency.predict((4, 56)) > 100.0
    eight = slo([math.nan] * 8)
    assert policy._cost_plan(eight).depth == 0
    assert [drafted(policy, 8, 4, 2, eight) for _ in range(2)] == [(4, 2)] * 2
    assert policy.stats.speculation_reasons == {"probe": 2}
    assert policy.draft_state.probe_every == policy.config.probe_interval  # no backoff
    observe_drafts(policy, 8, [(4, 2, 30.0)])
    assert drafted(policy, 8, 4, 2, eight)[0] > 0
    assert policy.stats.speculation_reasons["planned"] == 1


def test_adaserve_explores_the_full_shape_and_a_one_step_chain():
    policy = speculating_policy(AdaserveConfig(explore_interval=3))
    shapes = [drafted(policy, 1, 4, 2, slo([math.nan])) for _ in range(6)]
    assert shapes == [(2, 1)] * 2 + [(4, 2)] + [(2, 1)] * 2 + [(1, 1)]


def test_adaserve_explores_no_wider_than_its_plan_may_run():
    # Draft rows are free (a step costs 1 ms at any width), so the full 4 x 2 search is cheap
    # to explore. With B2 = 2 the plan at 2 requests may run no beam wider than 2 // 2 = 1,
    # and the exploring draft is the full-depth chain; at 1 request, or with the default B2,
    # it is the full search.
    def explored(requests: int, draft_tokens_per_step: int) -> tuple[int, int]:
        tree = AdaptiveTreeConfig(draft_tokens_per_step=draft_tokens_per_step)
        policy = speculating_policy(AdaserveConfig(explore_interval=3, tree=tree))
        policy.draft_latency.seed([((1, 1), 1.0), ((1, 16), 1.0), ((4, 7), 4.0), ((4, 28), 4.0)])
        policy.plain_latency.seed([((requests, 10), 10.0)])
        batch = slo([math.nan] * requests)
        return [drafted(policy, requests, 4, 2, batch) for _ in range(3)][-1]

    assert explored(2, 2) == (4, 1)
    assert explored(1, 2) == (4, 2)
    assert explored(2, 64) == (4, 2)


def test_adaserve_explores_a_full_depth_chain_where_the_full_search_costs_too_much():
    # Draft rows now cost 0.1 ms each (0.8 ms per step, 0.1 fixed): at 8 requests the full
    # 4 x 2 search (56 rows) costs 5.6 ms more than a planned 2 x 1 chain (16 rows), over 25 %
    # of the planned iteration; the 4-deep chain (32 rows) keeps the deeper shapes' gain known.
    def policy_at(num_requests: int) -> AdaservePolicy:
        policy = speculating_policy(AdaserveConfig(explore_interval=3))
        policy.draft_latency.seed([((1, 1), 1.0), ((4, 7), 4.0), ((1, 101), 11.0)])
        policy.plain_latency.seed([((num_requests, 10), 10.0)])
        return policy

    batch = slo([math.nan] * 8)
    light, heavy = policy_at(1), policy_at(8)
    assert [drafted(light, 1, 4, 2, slo([math.nan])) for _ in range(3)][-1] == (4, 2)
    shapes = [drafted(heavy, 8, 4, 2, batch) for _ in range(6)]
    planned = shapes[0]
    assert planned[0] < 4  # speculating, below the full depth
    assert shapes == [planned] * 2 + [(4, 1)] + [planned] * 2 + [(1, 1)]


def test_adaserve_remeasures_a_plain_decode_where_its_price_could_change_the_plan():
    # Three requests speculate against their own plain price (12.5 ms), but a plain decode at
    # one request was measured at 4 ms: at that price a plain decode would win (0.75 tokens per
    # ms against ~0.6), so a stalled measurement at three could be what keeps them speculating.
    policy = speculating_policy(AdaserveConfig(explore_interval=1000))
    policy.plain_latency = VerifyLatency(with_context=False)
    policy.plain_latency.seed([((1, 10), 4.0), ((3, 30), 12.5)])
    three = slo([math.nan] * 3)
    shapes = [drafted(policy, 3, 4, 2, three) for _ in range(4 * REMEASURE_PLAIN)]
    plain_at = [i for i, (depth, _) in enumerate(shapes) if depth == 0]
    # Two plain iterations in a row each time: only the second is a steady price.
    starts = plain_at[::REMEASURE_RUN]
    assert all(plain_at[i + 1] == plain_at[i] + 1 for i in range(0, len(plain_at) - 1, 2))
    # Soon at first (so a stalled measurement is outvoted), then ever more rarely: gaps count
    # the speculative iterations between two runs, and the run's first.
    gaps = [b - a - REMEASURE_RUN + 1 for a, b in zip([-REMEASURE_RUN, *starts], starts)]
    assert gaps[0] == FIRST_REMEASURE
    assert gaps == sorted(gaps) and gaps[-1] == REMEASURE_PLAIN
    # The plan resumes after each, through a cold chain: at one request speculation does not
    # pay, so the stand-down skipped the draft's extend.
    resumed = [shapes[i + REMEASURE_RUN : i + REMEASURE_RUN + 2] for i in starts[:-1]]
    assert resumed == [[(1, 1), (2, 1)]] * (len(starts) - 1)


def measured_plain(policy, times: int, ms: float = 10.0):
    """`policy` with `times` more plain iterations measured at one request, at `ms`."""
    policy.plain_latency.seed([((1, 10), ms)] * times)
    return policy


def test_adaserve_does_not_remeasure_where_speculation_beats_any_plain_decode():
    # Speculation (2.6 tokens in ~12 ms) beats every plain price measured (10 ms a token):
    # no re-measurement could change the choice, so none costs an iteration.
    policy = speculating_policy(AdaserveConfig(explore_interval=1000))
    measured_plain(policy, FLOOR_MEASUREMENTS - 1)
    shapes = [drafted(policy, 1, 4, 2, slo([math.nan])) for _ in range(4 * REMEASURE_PLAIN)]
    assert shapes == [(2, 1)] * (4 * REMEASURE_PLAIN)


def test_adaserve_remeasures_while_its_floor_may_be_a_start_up_stall():
    # As above, but only FLOOR_MEASUREMENTS - 1 plain iterations measured (all of them could
    # have been stalled ones, right after start-up): the re-measurements run, soon at first.
    policy = speculating_policy(AdaserveConfig(explore_interval=1000))
    measured_plain(policy, FLOOR_MEASUREMENTS - 2)
    shapes = [drafted(policy, 1, 4, 2, slo([math.nan])) for _ in range(2 * FIRST_REMEASURE)]
    plain_at = [i for i, (depth, _) in enumerate(shapes) if depth == 0]
    first = FIRST_REMEASURE - 1  # the run's first counts among the FIRST_REMEASURE
    assert plain_at[:REMEASURE_RUN] == list(range(first, first + REMEASURE_RUN))


def test_adaserve_does_not_measure_a_new_load_where_speculation_beats_any_plain_decode():
    # Measured at one request (10 ms); at three, speculation beats even that price, which no
    # batch of three undercuts: no plain iteration to measure theirs.
    policy = measured_plain(
        speculating_policy(AdaserveConfig(explore_interval=1000)), FLOOR_MEASUREMENTS - 1
    )
    assert [drafted(policy, 3, 4, 2, slo([math.nan] * 3)) for _ in range(3)] == [(2, 1)] * 3


def test_adaserve_measures_a_plain_decode_at_a_new_load_where_it_could_change_the_plan():
    # A plain decode at one request measured at 4 ms beats speculation's 2.6 tokens in 12 ms:
    # at three requests, speculation is planned against their own price, once measured.
    policy = speculating_policy(AdaserveConfig(explore_interval=1000))
    policy.plain_latency = VerifyLatency(with_context=False)
    policy.plain_latency.seed([((1, 10), 4.0)])
    assert drafted(policy, 1, 4, 2, slo([math.nan]))[0] == 0  # a stand-down at one request
    assert drafted(policy, 3, 4, 2, slo([math.nan] * 3))[0] == 0  # n = 3: not yet
    feed(
        policy,
        verify_ms=12.0,
        iteration_ms=30.0,
        accepted=1,
        requests=3,
        after_prefill=True,
        draft_kept=True,
    )
    assert drafted(policy, 3, 4, 2, slo([math.nan] * 3))[0] == 0  # a switch, not a price
    feed(policy, verify_ms=12.0, iteration_ms=12.5, accepted=1, requests=3, draft_kept=True)
    assert policy.plain_latency.predict((3, 30)) == pytest.approx(12.5, rel=1e-3)
    # Measured: speculation pays at three (after a cold chain: at one request it does not
    # pay, so the stand-down there had skipped the draft's extend).
    assert drafted(policy, 3, 4, 2, slo([math.nan] * 3)) == (1, 1)
    assert drafted(policy, 3, 4, 2, slo([math.nan] * 3)) == (2, 1)
    assert drafted(policy, 2, 4, 2, slo([math.nan] * 2))[0] > 0  # 2 and 3 share a bucket


def test_a_plain_decode_is_priced_among_plain_ones():
    """The first plain iteration after a prefill, after speculation or after requests finished
    pays a switch or a release once; a stand-down does not pay it per iteration, so it is no
    plain decode's price, unless nothing steadier comes (prefills between every two decodes)."""
    policy = AdaservePolicy(AdaserveConfig())
    feed(policy, verify_ms=90.0, iteration_ms=100.0, accepted=1, requests=2, after_prefill=True)
    feed(policy, verify_ms=9.0, iteration_ms=40.0, accepted=1)  # one of the two finished
    feed(policy, verify_ms=9.0, iteration_ms=10.0, accepted=1)
    assert policy.plain_latency.num_observations == 1
    assert policy.plain_latency.predict((1, 10)) == pytest.approx(10.0)
    cold = iteration_input(beam([[[0.9]]]), 1, 1)
    policy.observe(verified_outcome(cold, policy.decide(cold), accepted=0))
    feed(policy, verify_ms=20.0, iteration_ms=25.0, accepted=1)  # after speculation
    assert policy.plain_latency.num_observations == 1
    for _ in range(MAX_PLAIN_UNFITTED - 1):
        feed(policy, verify_ms=20.0, iteration_ms=25.0, accepted=1, after_prefill=True)
    assert policy.plain_latency.num_observations == 2  # the third unsteady one in a row


def test_adaserve_does_not_price_a_plain_decode_by_its_warm_up():
    policy = AdaservePolicy(AdaserveConfig())
    one = slo([math.nan])
    assert drafted(policy, 1, 4, 2, one) == (0, 2)
    feed(policy, verify_ms=90.0, iteration_ms=100.0, accepted=1, after_prefill=True)  # the first
    assert policy.plain_latency.num_observations == 0
    assert drafted(policy, 1, 4, 2, one) == (0, 2)  # so it is measured again
    feed(policy, verify_ms=9.0, iteration_ms=10.0, accepted=1)
    assert policy.plain_latency.predict((1, 10)) == pytest.approx(10.0)


def test_the_servers_first_speculative_iteration_prices_nothing():
    """Its time holds one-off set-up (`Outcome.warm_up`): neither the verify nor the draft
    cost model learns it; the next speculative iteration prices both."""
    policy = AdaservePolicy(AdaserveConfig())
    it = iteration_input(beam([[[0.9], [0.8]]]), 2)
    for warm_up, verify_ms, iteration_ms in ((True, 90.0, 300.0), (False, 10.0, 30.0)):
        outcome = make_outcome(
            it, policy.decide(it), rids=("r0",), context_tokens=100,
            accepted=torch.tensor([3]), verify_ms=verify_ms, iteration_ms=iteration_ms,
            warm_up=warm_up,
        )  # fmt: skip
        assert outcome.speculated and outcome.warm_up == warm_up
        policy.observe(outcome)
        priced = int(not warm_up)
        assert policy.verify_latency.num_observations == priced
        assert policy.draft_latency.num_observations == priced
    assert policy.verify_latency.predict((3, 100)) == pytest.approx(10.0)
    assert policy.draft_latency.predict((2, 2)) == pytest.approx(20.0)  # 30 - the verify's 10
    # /server_info shows both iterations' wall times.
    assert policy.stats.as_dict()["first_speculative_iteration_ms"] == [300.0, 30.0]


def test_adaserve_plain_outcome_is_counted_apart():
    policy = AdaservePolicy(AdaserveConfig())
    feed(policy, verify_ms=90.0, iteration_ms=99.0, accepted=1)  # a warm-up, not learned
    feed(policy, verify_ms=10.0, iteration_ms=11.0, accepted=1)  # a plain iteration
    assert policy.plain_latency.predict((1, 10)) == pytest.approx(11.0)
    assert policy.stats.iterations == 0  # speculative iterations only
    assert policy.verify_latency.num_observations == 2


def test_adaserve_measures_a_plain_decode_first_and_warms_a_cold_draft():
    policy = AdaservePolicy(AdaserveConfig())
    one = slo([math.nan])
    policy.verify_latency.seed([((1, 10), 10.0), ((8, 10), 12.0)])
    assert drafted(policy, 1, 4, 2, one) == (0, 2)  # nothing measured: a plain decode
    feed(policy, verify_ms=60.0, iteration_ms=70.0, accepted=1)  # the warm-up, not learned
    # Nothing is learned yet, so a plain iteration would keep the draft's state, but this
    # server could not (no steps-0 runtime state): the draft is stale after it, so a depth-1
    # chain comes first, whose gain is not learned.
    assert policy.draft_shape(1, 4, 2, one) == (0, 2) and policy.keep_draft_warm()
    feed(policy, verify_ms=10.0, iteration_ms=10.5, accepted=1, draft_kept=False)
    assert drafted(policy, 1, 4, 2, one) == (1, 1)
    cold = iteration_input(beam([[[0.9]]]), 1, 1)
    policy.observe(verified_outcome(cold, policy.decide(cold), accepted=0))
    assert not policy.gain.known
    # Nor its acceptance: the stale draft was sure (f 0.9) and wrong.
    assert policy.stats.calibration_trials == 0 and policy.stats.observed_accepted == 0
    assert drafted(policy, 1, 4, 2, one) == (4, 2)  # then the full search, learned from
    warm = iteration_input(beam([[[0.9, 0.1]] * 4]), 4, 2)
    policy.observe(verified_outcome(warm, policy.decide(warm), accepted=2, width=2))
    assert policy.gain.known
    assert policy.stats.calibration_trials > 0 and policy.stats.observed_accepted == 2


def verified_outcome(it, decision, accepted: int, width: int = 1):
    """The outcome of one request's verify of a `beam` of that width that accepted `accepted`
    draft tokens, the first-ranked node of each level."""
    deepest = torch.tensor([(accepted - 1) * width if accepted else -1])
    return make_outcome(
        it, decision, rids=("r",), context_tokens=10, accepted=torch.tensor([accepted + 1]),
        verify_ms=10.0, iteration_ms=12.0, deepest_accepted=deepest,
    )  # fmt: skip


def pays_alone(gain, verify, plain_ms, draft=free_draft):
    plain = None if plain_ms is None else torch.tensor([plain_ms])
    pays = speculation_pays(
        gain=gain, loads=torch.ones(1), context_per_request=0, verify_ms=verify, draft_ms=draft,
        plain_ms=plain,
    )  # fmt: skip
    return bool(pays)


def test_speculation_pays_alone_by_tokens_per_ms_of_one_request():
    gain = flat_gain(0.5, 4, 2)  # a chain of k nodes commits 1 + 0.5 k tokens
    # Every verified token costs a plain decode's 10 ms: at best (1 + 0.5) / 20 < 1 / 10.
    assert not pays_alone(gain, linear_ms(10.0, 10.0), plain_ms=10.0)
    # A flat verify curve: the 8 nodes commit 5 tokens in 10 ms, five times a plain decode's.
    assert pays_alone(gain, linear_ms(10.0, 0.0), plain_ms=10.0)
    # 4 ms per verified token: the best is all 8 nodes, 5 tokens in 10 + 32 ms (0.119 per
    # ms), against a plain decode's 1 / 8.5 = 0.118 (pays) or 1 / 8 = 0.125 (does not).
    assert pays_alone(gain, linear_ms(10.0, 4.0), plain_ms=8.5)
    assert not pays_alone(gain, linear_ms(10.0, 4.0), plain_ms=8.0)
    # The draft's own cost counts: at 1 ms per draft row the full 4 x 2 beam (7 rows) commits
    # 5 tokens in 17 ms (0.294 per ms): it pays against a 4 ms plain decode, not a 3 ms one.
    one_ms_per_row = lambda depth, rows: torch.as_tensor(rows, dtype=torch.float64)
    assert pays_alone(gain, linear_ms(10.0, 0.0), plain_ms=4.0, draft=one_ms_per_row)
    assert not pays_alone(gain, linear_ms(10.0, 0.0), plain_ms=3.0, draft=one_ms_per_row)


def test_speculation_pays_at_a_load_where_its_fixed_price_is_shared():
    # The demo's CPU: a verify pass costs 20 ms and 1 per token past the first, a plain
    # decode 5 ms per request. Alone, 8 nodes commit 5 tokens in 28 ms, short of a plain
    # decode's 1 per 5 ms; at three requests each commits 5 in 46 ms against 1 per 15 ms.
    gain = flat_gain(0.5, 4, 2)
    pays = speculation_pays(
        gain=gain, loads=torch.tensor([1.0, 3.0]), context_per_request=0,
        verify_ms=linear_ms(20.0, 1.0), draft_ms=free_draft, plain_ms=torch.tensor([5.0, 15.0]),
    )  # fmt: skip
    assert pays.tolist() == [False, True]


def test_speculation_pays_alone_until_measured():
    assert pays_alone(ShapeGain(), linear_ms(10.0, 10.0), plain_ms=10.0)  # no draft seen yet
    assert pays_alone(flat_gain(0.5, 4, 2), linear_ms(10.0, 10.0), plain_ms=None)


def test_adaserve_keeps_the_draft_warm_where_speculation_pays_alone():
    policy = speculating_policy(AdaserveConfig())
    assert policy.keep_draft_warm()
    # Standing down at a load where it does not pay, the draft's state is kept...
    feed(policy, verify_ms=10.0, iteration_ms=10.0, accepted=1, draft_kept=True)
    assert not policy.draft_is_stale() and drafted(policy, 1, 4, 2, slo([math.nan])) == (2, 1)
    # ... and a plain iteration that skipped the extend makes the next draft a cold chain.
    feed(policy, verify_ms=10.0, iteration_ms=10.0, accepted=1, draft_kept=False)
    assert drafted(policy, 1, 4, 2, slo([math.nan])) == (1, 1) and policy.draft_is_stale()


def test_adaserve_lets_the_draft_go_stale_where_speculation_never_pays():
    policy = AdaservePolicy(AdaserveConfig())
    policy.verify_latency.seed([((1, 10), 10.0), ((8, 10), 80.0)])  # every token a decode's price
    policy.plain_latency.seed([((1, 10), 10.0)])
    policy.draft_latency.seed([((1, 1), 2.0), ((4, 7), 8.0)])
    policy.gain = flat_gain(0.5, 4, 2)
    assert not policy.keep_draft_warm()
    assert AdaservePolicy(AdaserveConfig(budget_rule="knee")).keep_draft_warm()
    assert policy.draft_prefills(1)  # not before the plan has stood down for a long window
    stand_down(policy)
    # New requests are prefilled without the draft too, but for one prefill in
    # probe_interval: probes need requests the draft has read.
    prefills = [policy.draft_prefills(1) for _ in range(2 * policy.config.probe_interval)]
    assert prefills.count(True) == 2 and prefills[policy.config.probe_interval - 1]
    assert AdaservePolicy(AdaserveConfig()).draft_prefills(1)  # nothing learned yet


def stand_down(policy: AdaservePolicy) -> None:
    """Drafts decided at one request for as long as `draft_prefills` asks the plan to stand
    down before it blinds new requests; the plan must choose a plain decode in each."""
    for _ in range(BLIND_AFTER * policy.config.probe_interval):
        policy.draft_shape(1, 4, 2, slo([math.nan]))
        assert policy._running_plan is None


def test_adaserve_prefills_with_the_draft_where_speculation_pays_at_a_load_run():
    # The demo's CPU (see above): speculation pays at three requests, not at one.
    policy = AdaservePolicy(AdaserveConfig())
    policy.verify_latency.seed([((1, 0), 21.0), ((9, 0), 29.0), ((27, 0), 47.0)])
    policy.plain_latency.seed([((1, 0), 5.0), ((3, 0), 15.0)])
    policy.draft_latency.seed([((1, 1), 0.0), ((4, 7), 0.0)])
    policy.gain = flat_gain(0.5, 4, 2)
    assert not policy.keep_draft_warm()  # a stand-down alone lets the draft go stale...
    stand_down(policy)
    assert not policy.draft_prefills(1)  # ... and, having run one request only, so do prefills
    # A burst of three after a quiet spell brings a load where speculation pays: kept.
    assert policy.draft_prefills(3)
    three = make_outcome(
        None, None, rids=("a", "b", "c"), context_tokens=0, accepted=torch.ones(3),
        verify_ms=14.0, iteration_ms=15.0,
    )  # fmt: skip
    policy.observe(three)
    assert not policy.keep_draft_warm()
    # Having run three requests, where speculation pays, every prefill keeps the draft.
    assert all(policy.draft_prefills(1) for _ in range(2 * policy.config.probe_interval))


def test_shape_gain_leaves_out_requests_blind_to_the_draft():
    # Request 1 was prefilled without the draft: its f read 0 and say nothing of the shape.
    gain = ShapeGain(max_nodes=2)
    gain.observe(beam([[[0.9], [0.8]], [[0.0], [0.0]]]), 2, 1, groups=[20.0, 20.0])
    gain.refresh(lambda f: f)
    assert gain.curve(2, 1).tolist() == pytest.approx([0, 0.9, 1.7])
    assert gain.group_table(20.0)[1].tolist() == pytest.approx([0, 0.9, 1.7])
    gain.observe(beam([[[0.0], [0.0]]]), 2, 1)  # a draft of blind requests only: no news
    assert gain.version == 1


def plain_outcome(warm: bool, iteration_ms: float = 9.0):
    return make_outcome(
        None, None, rids=("r0",), context_tokens=0, accepted=torch.ones(1),
        verify_ms=iteration_ms - 1.0, iteration_ms=iteration_ms, draft_kept=warm,
    )  # fmt: skip


def test_adaserve_asks_whether_speculation_pays_against_a_decode_without_draft_work():
    policy = AdaservePolicy(AdaserveConfig())
    policy.verify_latency.seed([((1, 0), 10.0), ((9, 0), 42.0)])  # 4 ms per verified token
    policy.plain_latency.seed([((1, 0), 9.0)])
    policy.draft_latency.seed([((1, 1), 1.0), ((4, 7), 1.0)])  # a draft forward: 1 ms
    policy.gain = flat_gain(0.5, 4, 2)
    # 5 tokens in 10 + 32 + 1 ms: 0.116 per ms, 4.6 % over a cold 9 ms decode: from a cold
    # plain iteration that is short of the 10 % switch margin, and stays so (no flip).
    for _ in range(3):
        assert not policy.keep_draft_warm()
        policy.observe(plain_outcome(warm=False))
    # From a warm one no margin is asked: 9 ms less a tenth of the 1 ms draft forward.
    policy.observe(plain_outcome(warm=True))
    assert policy.keep_draft_warm()
    # Run warm, the fitted 9 ms is mostly warm iterations, each holding the 1 ms draft
    # forward: against ~8 ms without it, speculation's 1 / 8.6 does not pay.
    for _ in range(8):
        policy.observe(plain_outcome(warm=True))
    assert policy.plain_latency.predict((1, 0)) == pytest.approx(9.0, rel=0.05)
    assert not policy.keep_draft_warm()
    # Then cold, it stays cold.
    for _ in range(5):
        policy.observe(plain_outcome(warm=False))
        assert not policy.keep_draft_warm()


def test_a_long_stand_down_keeps_the_draft_warm_only_where_the_next_draft_is_near():
    # Alone, a full 4 x 2 draft commits 5 tokens in ~47 ms + a 1 ms draft against a 12 ms
    # plain decode: it pays, by more than the switch margin. At three requests (14 ms plain)
    # it never does, so the plan stands down there and probes now and then.
    policy = AdaservePolicy(AdaserveConfig())
    policy.verify_latency.seed([((1, 0), 14.0), ((3, 0), 22.0), ((9, 0), 46.0), ((27, 0), 118.0)])
    policy.plain_latency.seed([((1, 0), 12.0), ((3, 0), 14.0)])
    policy.draft_latency.seed([((1, 1), 1.0), ((4, 7), 1.0)])  # any draft forward: 1 ms
    policy.gain = flat_gain(0.5, 4, 2)
    # A cold start at three (a 1 x 1 chain verifying the roots, against a plain decode)
    # costs the extends (1 ms each) of `tail` plain iterations.
    cold_ms = policy.verify_latency.predict((3, 0)) + 1.0 - policy.plain_latency.predict((3, 0))
    assert 8.0 < cold_ms < 10.0 and policy.draft_latency.predict((1, 3)) == pytest.approx(1.0)
    tail = math.ceil(cold_ms) - 1
    three = slo([math.nan] * 3)
    runs = [[]]  # per stretch between two drafts: whether each of its plain iterations ran warm
    window = BLIND_AFTER * policy.config.probe_interval
    for _ in range(600):
        if policy.draft_shape(3, 4, 2, three)[0] > 0:
            runs.append([])
            continue
        assert policy._running_plan is None
        runs[-1].append(policy.keep_draft_warm())
    stretches = [run for run in runs if run]  # the last one ends with no probe after it
    # A fresh stand-down keeps the draft warm, as speculation pays for one request alone...
    assert all(stretches[0]) and len(stretches[0]) < window
    # ... a long one over the last `tail` plain iterations before its next probe alone.
    decided = list(itertools.accumulate(len(run) + 2 for run in stretches))  # 2 per probe
    long = [run for run, end in zip(stretches[:-1], decided) if end - len(run) > window]
    assert len(long) >= 2 and all(len(run) > tail for run in long)
    assert all(run == [False] * (len(run) - tail) + [True] * tail for run in long)


def test_the_switch_margin_is_asked_of_tokens_per_ms_not_of_the_slo_weighted_objective():
    # One request far ahead of a 100 ms SLO. A 4-deep chain of f = .9 commits 4.6 tokens in
    # 12 ms: 3.8x a plain decode's tokens per ms, past a margin of 2 (3x). The objective
    # counts tokens beyond the request's pace at a tenth, so it reads only ~2.5x plain's: with
    # the margin asked of it, a plan held back by its track record stood down at 4x the rate.
    ahead = slo([100.0], elapsed_ms=[0.0], tokens=[10.0])
    choice = plan(flat_gain(0.9, 4, 1), 1, linear_ms(10.0, 0.5), batch=ahead, margin=2.0)
    assert choice.depth == 4
    assert choice.tokens_per_ms > 3.0 * choice.plain_tokens_per_ms
    assert choice.objective < 3.0 * choice.plain_objective
    # Past the rate's margin it stands down.
    assert plan(flat_gain(0.9, 4, 1), 1, linear_ms(10.0, 0.5), batch=ahead, margin=3.0).depth == 0


def test_a_request_blind_to_the_draft_keeps_the_plan_plain():
    # Two requests whose draft is right 3 times in 4: a 4-deep chain pays on a flat verify. With
    # one of them prefilled without the draft it would commit 1 token per longer iteration:
    # slower than a plain decode serves it, so the plan stays plain until it finishes.
    gain = flat_gain(0.75, 4, 1, requests=2)
    seeing = slo([math.nan, math.nan])
    assert plan(gain, 2, linear_ms(10.0, 0.0), free_draft, batch=seeing).depth > 0
    blind = SloBatch(
        seeing.tpot_slo_ms, seeing.decode_elapsed_ms, seeing.tokens_out,
        draft_blind=torch.tensor([False, True]),
    )  # fmt: skip
    choice = plan(gain, 2, linear_ms(10.0, 0.0), free_draft, batch=blind)
    assert choice.depth == 0
    with pytest.raises(ValueError, match="draft_blind"):
        SloBatch(seeing.tpot_slo_ms, seeing.decode_elapsed_ms, seeing.tokens_out, torch.ones(3))


def test_the_decision_log_says_why_each_iteration_ran_as_it_did(tmp_path):
    """One JSON line per observed iteration: what ran and measured, the reason and the plan."""
    policy = speculating_policy(AdaserveConfig())
    log = DecisionLog(tmp_path / "decisions.jsonl", dp_rank=1)
    one = slo([math.nan])
    steps, width = drafted(policy, 1, 4, 2, one)
    it = iteration_input(beam([[[0.8, 0.0]] * steps]), steps, width, context_len=10)
    outcome = make_outcome(
        it, policy.decide(it), rids=it.rids, context_tokens=10,
        accepted=torch.tensor([3]), verify_ms=10.0, iteration_ms=12.0,
    )  # fmt: skip
    policy.observe(outcome)
    log.write(outcome, policy.account())
    # A verify that every extra token costs a whole decode: the plan stands down.
    policy.verify_latency = VerifyLatency()
    policy.verify_latency.seed([((1, 10), 10.0), ((3, 10), 30.0), ((9, 10), 90.0)])
    assert drafted(policy, 1, 4, 2, one)[0] == 0
    plain = make_outcome(None, None, rids=("r0",), context_tokens=11,
                         accepted=torch.tensor([1]), verify_ms=9.0, iteration_ms=10.0)  # fmt: skip
    policy.observe(plain)
    log.write(plain, policy.account())
    log.close()
    lines = (tmp_path / "decisions.jsonl").read_text().splitlines()
    first, second = (json.loads(line) for line in lines)
    assert first["draft"] == [steps, width] and first["reason"] == "planned"
    assert first["dp_rank"] == second["dp_rank"] == 1
    assert first["plan"]["speculate"] and first["plan"]["depth"] == steps
    assert first["committed"] == 3 and first["iteration_ms"] == 12.0
    assert first["fits"]["draft"] is not None
    assert second["draft"][0] == 0 and second["reason"] == "stand down"
    assert second["plan"]["speculate"] is False and second["verified"] == 1


def stood_down_by_its_record(ratio: float) -> AdaservePolicy:
    """A policy whose plan would speculate (a 2 x 1 chain at ~2.2x a plain decode's tokens per
    ms) but whose track record at one request, formed by plans that delivered `ratio` of their
    prediction, asks every plan for more: it stands down."""
    policy = speculating_policy(AdaserveConfig())
    for _ in range(4):
        policy.record_at(1).observe(2.0, 10.0, 2.0 * ratio, 10.0)
    assert policy._cost_plan(slo([math.nan])).depth == 0
    return policy


def run_probe(policy, committed: int, iteration_ms: float) -> list[tuple[int, int]]:
    """Plain iterations until the stand-down probes, then the probe's two drafts, each
    committing `committed` tokens in `iteration_ms`; returns the shapes the probe drafted."""
    one = slo([math.nan])
    for _ in range(10 * policy.config.probe_interval):
        shape = drafted(policy, 1, 4, 2, one)
        if shape[0] > 0:
            break
        plain = make_outcome(
            None, None, rids=("r0",), context_tokens=10, accepted=torch.tensor([1]),
            verify_ms=9.0, iteration_ms=10.0,
        )  # fmt: skip
        policy.observe(plain)
    shapes = []
    for _ in range(2):
        if shapes:
            shape = drafted(policy, 1, 4, 2, one)
        shapes.append(shape)
        it = iteration_input(beam([[[0.5] * shape[1]] * shape[0]]), *shape, context_len=10)
        policy.observe(
            make_outcome(
                it, policy.decide(it), rids=it.rids, context_tokens=10,
                accepted=torch.tensor([committed]), verify_ms=8.0, iteration_ms=iteration_ms,
            )
        )  # fmt: skip
    return shapes


def test_a_probe_that_beats_a_plain_decode_clears_the_record_that_held_the_stand_down():
    """A record formed under earlier models (a bad fit, say) moves only while plans speculate,
    so it could hold a stand-down for good. A probe's measured draft that committed 3 tokens in
    12 ms, 2.5x a plain decode's 1 in 10, is speculation paying, measured: the record goes, and
    the plan speculates again."""
    policy = stood_down_by_its_record(0.4)
    assert run_probe(policy, committed=3, iteration_ms=12.0)[1] == (4, 2)
    assert policy.record_at(1).ratio == 1.0 and policy.stats.probes_that_paid == 1
    assert drafted(policy, 1, 4, 2, slo([math.nan]))[0] > 0


def test_a_probe_that_does_not_beat_a_plain_decode_leaves_the_record():
    """3 tokens in 40 ms is below a plain decode's 1 in 10: whatever it did to the gain table
    (a lucky draft lifts it), the record stands and so does the stand-down."""
    policy = stood_down_by_its_record(0.4)
    run_probe(policy, committed=3, iteration_ms=40.0)
    assert policy.record_at(1).ratio < 0.5 and policy.stats.probes_that_paid == 0
    assert policy._cost_plan(slo([math.nan])).depth == 0


def test_no_probe_while_every_running_request_is_blind_to_the_draft():
    """Blind requests' drafts verify nothing: a probe of them would measure nothing. One
    request that reads the draft is enough to probe."""
    policy = speculating_policy(AdaserveConfig())
    policy.plain_latency.seed([((2, 20), 10.0)])  # a blind request's plan: plain (1 per 10 ms)
    blind = SloBatch(
        torch.tensor([math.nan, math.nan], dtype=torch.float64), torch.zeros(2), torch.zeros(2),
        draft_blind=torch.tensor([True, True]),
    )  # fmt: skip
    shapes = {drafted(policy, 2, 4, 2, blind) for _ in range(8 * policy.config.probe_interval)}
    assert shapes == {(0, 2)} and "probe" not in policy.stats.speculation_reasons
    one_reads = dataclasses.replace(blind, draft_blind=torch.tensor([True, False]))
    shapes = [drafted(policy, 2, 4, 2, one_reads) for _ in range(4 * policy.config.probe_interval)]
    assert any(depth > 0 for depth, _ in shapes)
    assert policy.stats.speculation_reasons.get("probe", 0) > 0


def test_a_verify_run_as_a_plain_decode_prices_adaserves_plain_iteration_not_its_tree_verify():
    """On the CPU path a plain iteration's one-node verify runs the decode attention, cheaper
    than the line through tree verifies: adaserve, which prices plain iterations apart, keeps
    it out of the verify fit; a policy pricing its no-speculation choice with that fit keeps
    it in; a plain verify that ran a tree verify's path (the simulator, SGLang's own kernels)
    stays in either way."""
    from sgl_adaspec.speculative.policies.tetris import TetrisPolicy

    def plain(as_decode: bool):
        return make_outcome(None, None, rids=("r0", "r1"), context_tokens=20,
                            accepted=torch.tensor([1, 1]), verify_ms=9.0, iteration_ms=10.0,
                            verify_as_decode=as_decode)  # fmt: skip

    adaserve, tetris = AdaservePolicy(AdaserveConfig()), TetrisPolicy()
    for policy in (adaserve, tetris):
        policy.observe(plain(True))
        policy.observe(plain(False))
    assert adaserve.verify_latency.num_observations == 1
    assert adaserve.plain_latency.num_observations == 1  # the steady one (the first switched)
    assert tetris.verify_latency.num_observations == 2


def test_a_plan_that_stands_down_reports_the_draft_that_comes_nearest():
    """Every draft loses to a plain decode: the plan still names the one with the most tokens
    per ms (one node: (1 + 0.9) / 20 ms), not one that verifies nothing."""
    choice = plan(flat_gain(0.9, 4, 2), 1, linear_ms(10.0, 10.0))
    assert choice.depth == 0 and choice.objective < 0
    assert choice.expected_accepted == pytest.approx(1.9)
    assert choice.iteration_ms == pytest.approx(20.0)
    assert choice.tokens_per_ms == pytest.approx(1.9 / 20.0)
    assert choice.tokens_per_ms < choice.plain_tokens_per_ms


def test_the_wall_spread_is_the_deviation_of_iterations_log_wall_time_stalls_included():
    """Iterations alternating 10 ms and 40 ms of wall time (a 30 ms stall before every other
    one of 10 ms): log wall times log 10 and log 40, a deviation of log(4) / 2 about their
    mean (up to the decay's slight tilt toward the last). None measured: 0."""
    policy = AdaservePolicy()
    assert policy.wall_spread == 0.0
    for i in range(400):
        outcome = make_outcome(
            None, None, rids=("a",), context_tokens=0, accepted=torch.ones(1),
            verify_ms=10.0, iteration_ms=10.0, stall_ms=30.0 if i % 2 else 0.0,
        )  # fmt: skip
        policy.observe(outcome)
    assert policy.wall_spread == pytest.approx(math.log(4.0) / 2, rel=1e-3)
