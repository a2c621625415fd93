"""adaserve's cost rule before and after the draft (`adaserve.planner`: `plan_shape`,
`SloOutlook`, `speculation_pays`, `cost_budget`) on hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch
from adaserve_inputs import (
    beam,
    flat_gain,
    free_draft,
    linear_ms,
    plan,
    slo,
)

from sgl_adaspec.scheduler.slo import SloBatch
from sgl_adaspec.speculative.adaserve.gain_table import ShapeGain
from sgl_adaspec.speculative.adaserve.planner import (
    THROUGHPUT_TIE,
    SloOutlook,
    SpendCurve,
    cost_budget,
    speculation_pays,
)
from sgl_adaspec.speculative.latency import VerifyLatency


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
    where speculation met 88 %). The plan speculates and keeps both r0 and r1, however
    spread the iterations' wall time: r1's SLO is its mean pace over its iterations, so the
    room it must keep is the margin, not spreads of one iteration (two spreads of 1.0, as
    prefill stalls make them under load, asked 7x its pace and held loaded batches plain).
    Where r1's pace would keep less than the margin to spare, the plan guards r1 again."""
    gain = ShapeGain(max_nodes=4)
    gain.observe(beam([[[0.95]] * 4, [[1e-9]] * 4]), 4, 1, groups=[5.0, 100.0])
    gain.refresh(lambda f: f)
    choice = plan(gain, 2, linear_ms(10.0, 2.0), batch=slo([5.0, 100.0]))
    assert (choice.depth, choice.nodes_per_request, choice.iteration_ms) == (4, 2, 20.0)
    assert choice.objective == pytest.approx(2 + THROUGHPUT_TIE * 5.8 / 20 * 12 / 2)
    # r1's pace there is 100 / 20 = 5x what it needs (log 1.61 of room).
    for spread in (0.7, 1.0):
        spread_out = plan(gain, 2, linear_ms(10.0, 2.0), batch=slo([5.0, 100.0]), spread=spread)
        assert (spread_out.depth, spread_out.nodes_per_request) == (4, 2)
    # With an SLO of 22 ms, r1 at 1 token per 16-20 ms keeps at most 22 / 16 = 1.375x its
    # pace: a margin of 0.5 asks 1.5x, so r1 holds the plan plain; one of 0.3 asks 1.3x, which
    # the 16 ms shape (a 2-deep chain, k = 1) leaves.
    near = ShapeGain(max_nodes=4)
    near.observe(beam([[[0.95]] * 4, [[1e-9]] * 4]), 4, 1, groups=[5.0, 22.0])
    near.refresh(lambda f: f)
    assert plan(near, 2, linear_ms(10.0, 2.0), batch=slo([5.0, 22.0]), margin=0.5).depth == 0
    kept = plan(near, 2, linear_ms(10.0, 2.0), batch=slo([5.0, 22.0]), margin=0.3)
    assert (kept.depth, kept.iteration_ms) == (2, 16.0)


def test_cost_budget_stops_where_the_rate_peaks():
    # f' = 0.9, 0.5, 0.1; verify 10 ms + 2 ms per extra token; draft already paid.
    # m = 0: 1/10 = .100, m = 1: 1.9/12 = .158, m = 2: 2.4/14 = .171, m = 3: 2.5/16 = .156.
    f = torch.tensor([[0.9, 0.5, 0.1]])
    spend_ms = linear_ms(10.0, 2.0)(1.0 + torch.arange(4, dtype=torch.float64), 0)
    assert cost_budget(f, torch.ones_like(f, dtype=torch.bool), spend_ms) == 2  # beside the root
    # A draft's sunk 100 ms favours spending more: m = 3 is 2.5 / 116 against 2.4 / 114.
    assert cost_budget(f, torch.ones_like(f, dtype=torch.bool), 100.0 + spend_ms) == 3
    # Padding is never bought, and a curve shorter than the ranking bounds it.
    valid = torch.tensor([[True, True, False]])
    assert cost_budget(f, valid, 100.0 + spend_ms) == 2
    assert cost_budget(f, torch.ones_like(f, dtype=torch.bool), 100.0 + spend_ms[:2]) == 1


def test_cost_budget_never_buys_padding_nor_a_node_of_nothing_expected():
    # The selection relies on it (`select_within(..., min_key=None)`): flat and rising
    # curves, nodes of f' = 0 and padding anywhere.
    generator = torch.Generator().manual_seed(0)
    for _ in range(300):
        requests, nodes = torch.randint(1, 6, (2,), generator=generator).tolist()
        f = torch.rand(requests, nodes, dtype=torch.float64, generator=generator)
        f = torch.where(torch.rand(f.shape, generator=generator) < 0.3, 0.0, f)
        valid = torch.rand(f.shape, generator=generator) < 0.6
        per_token = float(torch.randint(0, 3, (), generator=generator))  # 0: a flat curve
        spend_ms = 5.0 + per_token * torch.arange(requests * nodes + 1, dtype=torch.float64)
        assert int(cost_budget(f, valid, spend_ms)) <= int((valid & (f > 0)).sum())


def test_tokens_curve_is_predict_tensor_bit_for_bit():
    model = VerifyLatency()
    for tokens, context in ((4, 100), (9, 250), (16, 300), (40, 900), (64, 400), (3, 120)):
        model.observe((tokens, context), 5.0 + 0.3 * tokens + 0.002 * context)
    tokens = 1.0 + torch.arange(80, dtype=torch.float64)
    curve = model.tokens_curve(tokens)
    for context in (0, 123, 4567):
        assert torch.equal(curve.at(context), model.predict_tensor(tokens, context))
    assert VerifyLatency().tokens_curve(tokens) is None


def test_spend_curve_is_the_sunk_draft_and_the_verify_at_the_context():
    model = VerifyLatency()
    for tokens, context in ((4, 100), (9, 250), (16, 300), (40, 900), (64, 400), (3, 120)):
        model.observe((tokens, context), -2.0 + 0.3 * tokens + 0.002 * context)
    tokens = 1.0 + torch.arange(80, dtype=torch.float64)
    spend = SpendCurve.of(7.5, model.tokens_curve(tokens))
    for context in (0, 123, 4567):
        # A verify predicted below 0 costs nothing: the iteration never costs less than the draft.
        expected = 7.5 + model.predict_tensor(tokens, context)
        assert torch.allclose(spend.at(context), expected, rtol=0, atol=1e-12)
        assert bool((spend.at(context) >= 7.5).all())
    assert bool((SpendCurve.of(0.0, model.tokens_curve(tokens)).at(0) > 0).all())


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


def test_a_plan_that_stands_down_reports_the_draft_that_comes_nearest():
    """Every draft loses to a plain decode: the plan still names the one with the most tokens
    per ms (one node: (1 + 0.9) / 20 ms), not one that verifies nothing."""
    choice = plan(flat_gain(0.9, 4, 2), 1, linear_ms(10.0, 10.0))
    assert choice.depth == 0 and choice.objective < 0
    assert choice.expected_accepted == pytest.approx(1.9)
    assert choice.iteration_ms == pytest.approx(20.0)
    assert choice.tokens_per_ms == pytest.approx(1.9 / 20.0)
    assert choice.tokens_per_ms < choice.plain_tokens_per_ms
