"""The adaserve policy's drafts under the cost rule, through its modes: stand-downs and
probes, exploring drafts, plain (re-)measurements, cold drafts, the decision log's reasons."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from adaserve_inputs import (
    beam,
    drafted,
    feed,
    flat_gain,
    measured_plain,
    observe_drafts,
    run_probe,
    slo,
    speculating_policy,
    standing_down_policy,
    stood_down_by_its_record,
    verified_outcome,
)
from policy_inputs import iteration_input

from sgl_adaspec.scheduler.slo import SloBatch
from sgl_adaspec.speculative.adaserve.config import AdaserveConfig
from sgl_adaspec.speculative.adaserve.knee_shape import AdaptiveTreeConfig
from sgl_adaspec.speculative.adaserve.modes import (
    FIRST_REMEASURE,
    REMEASURE_PLAIN,
    REMEASURE_RUN,
)
from sgl_adaspec.speculative.adaserve.policy import AdaservePolicy
from sgl_adaspec.speculative.adaserve.pricing import FLOOR_MEASUREMENTS
from sgl_adaspec.speculative.decision_log import DecisionLog
from sgl_adaspec.speculative.latency import VerifyLatency
from sgl_adaspec.speculative.policies.base import make_outcome
from sgl_adaspec.speculative.shapes import draft_rows


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
