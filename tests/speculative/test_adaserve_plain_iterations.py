"""The adaserve policy's plain iterations: a plain decode's price (`adaserve.plain_price`, on
its own and through the policy), whether a stand-down keeps the draft warm, and whether new
requests are prefilled with it."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from adaserve_inputs import (
    beam,
    drafted,
    feed,
    flat_gain,
    plain_outcome,
    slo,
    speculating_policy,
    stand_down,
    verified_outcome,
)
from policy_inputs import iteration_input

from sgl_adaspec.speculative.adaserve.config import AdaserveConfig
from sgl_adaspec.speculative.adaserve.modes import BLIND_AFTER
from sgl_adaspec.speculative.adaserve.plain_price import WARM_SHARE_DECAY, PlainPrice
from sgl_adaspec.speculative.adaserve.policy import AdaservePolicy
from sgl_adaspec.speculative.latency import VerifyLatency
from sgl_adaspec.speculative.policies.base import make_outcome
from sgl_adaspec.speculative.policies.measurements import MAX_PLAIN_UNFITTED


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


def test_a_plain_price_is_the_fit_lowered_where_it_measured_cheaper():
    fit = VerifyLatency(with_context=False)
    fit.seed([((1, 0), 10.0), ((4, 0), 16.0)])  # ~2 ms per request over 8 ms
    line = fit.predict
    price = PlainPrice()
    assert price.price(fit, 4, 0) == line((4, 0)) and price.loads_measured == 0
    assert price.measured_at(fit, 5) and not price.measured_at(fit, 8)
    assert price.loads_measured == 2  # buckets 1 and 4-7
    for ms in (12.0, 12.0, 12.0):
        price.observe_steady(4, 0, ms)
    assert price.price(fit, 4, 0) == pytest.approx(12.0)
    assert price.price(fit, 6, 0) == pytest.approx(line((6, 0)) * 12.0 / line((4, 0)))
    assert price.price(fit, 1, 0) == line((1, 0))
    for ms in (30.0, 30.0, 30.0):  # dearer than the fit: never raised
        price.observe_steady(1, 0, ms)
    assert price.price(fit, 1, 0) == line((1, 0))


def test_the_warm_share_of_plain_iterations_decays():
    price = PlainPrice()
    price.observe_plain(True)
    assert price.last_warm and price.warm_share == pytest.approx(1.0 - WARM_SHARE_DECAY)
    price.observe_plain(False)
    assert not price.last_warm
    assert price.warm_share == pytest.approx(WARM_SHARE_DECAY * (1.0 - WARM_SHARE_DECAY))
