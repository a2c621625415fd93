"""Simulator invariants: conservation, no gain without acceptance, determinism, and the
SLO-aware policy serving the tight class better than the static tree."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from sgl_adaspec.scheduler.cost_model import knee_budget
from sgl_adaspec.scheduler.slo import SloBatch
from sgl_adaspec.scheduler.slo_config import DEFAULT_SLO_CONFIG, load_slo_config
from sgl_adaspec.sim.acceptance import SYNTHETIC_DEFAULT, zero_acceptance
from sgl_adaspec.sim.acceptance import resolve as resolve_acceptance
from sgl_adaspec.sim import engine
from sgl_adaspec.sim.engine import EngineConfig, simulate
from sgl_adaspec.sim.latency import get_preset
from sgl_adaspec.sim.policies import EXTRA_POLICY_NAMES, POLICY_NAMES, SimStep, make_policy
from sgl_adaspec.sim.trees import draft_trees
from sgl_adaspec.sim.workload import WorkloadArrays, poisson_workload

ALL_POLICIES = POLICY_NAMES + EXTRA_POLICY_NAMES
SPECULATIVE = [p for p in ALL_POLICIES if p != "none"]


def _run(preset, workload, policy, acceptance=SYNTHETIC_DEFAULT, seed=0, **engine):
    latency = get_preset(preset)
    budget = knee_budget(latency.verify_profile())
    return simulate(
        workload,
        latency,
        acceptance,
        make_policy(policy, budget, latency.baseline_tpot_ms),
        seed,
        EngineConfig(**engine),
        record_iterations=True,
    )


def _workload(preset, rate, num_requests, seed=0):
    latency = get_preset(preset)
    slo = load_slo_config(DEFAULT_SLO_CONFIG)
    return poisson_workload(rate, num_requests, slo, latency.baseline_tpot_ms, seed)


@pytest.mark.parametrize("policy", ALL_POLICIES)
@pytest.mark.parametrize("max_running", [4, 128])
def test_every_request_finishes_once_with_exactly_its_tokens(policy, max_running):
    workload = _workload("h100-llama8b", 40.0, 60)
    result = _run("h100-llama8b", workload, policy, max_running_requests=max_running)
    assert (result.finished_count == 1).all()
    assert (result.committed == workload.output_tokens).all()
    # One token per request from prefill, the rest from decode iterations.
    assert sum(result.log.committed) + workload.num_requests == workload.output_tokens.sum()
    assert max(result.log.num_requests) <= max_running
    assert (workload.arrival_s < result.first_token_s).all()
    assert (result.first_token_s < result.finish_s).all()
    assert np.isfinite(result.tpot_ms).all()


@pytest.mark.parametrize("policy", SPECULATIVE)
@pytest.mark.parametrize("preset,rate", [("a100x4-llama70b", 3.0), ("h100-llama8b", 30.0)])
def test_without_acceptance_speculation_never_beats_no_speculation(policy, preset, rate):
    workload = _workload(preset, rate, 60, seed=1)
    zero = zero_acceptance()
    plain = _run(preset, workload, "none", zero)
    spec = _run(preset, workload, policy, zero)
    # Each decode iteration commits exactly the bonus token of every running request...
    assert spec.log.committed == spec.log.num_requests
    assert spec.accepted_drafts == 0
    # ...and costs at least a plain decode step, so no request is served faster: on average
    # at all, and each request by at most 10 % (a speculating server's iterations take other
    # times, so requests meet in other batches and other prefills fall inside a request's
    # decoding: one that starts decoding later, behind a drained queue, can decode a little
    # faster; adaserve's full-draft variant, standing down with prefills without the draft,
    # served one request here 8 % faster and the 60 requests 0.7 % slower on average).
    assert spec.tpot_ms.mean() >= plain.tpot_ms.mean()
    assert (spec.tpot_ms >= 0.9 * plain.tpot_ms).all()
    assert spec.met.sum() <= plain.met.sum()


def test_same_seed_same_result_other_seed_other_result():
    workload = _workload("a100x4-llama70b", 5.0, 50)
    first = _run("a100x4-llama70b", workload, "adaserve", seed=7)
    again = _run("a100x4-llama70b", workload, "adaserve", seed=7)
    other = _run("a100x4-llama70b", workload, "adaserve", seed=8)
    assert np.array_equal(first.finish_s, again.finish_s)
    assert first.log.verified == again.log.verified
    assert not np.array_equal(first.finish_s, other.finish_s)
    assert _workload("a100x4-llama70b", 5.0, 50).arrival_s.tolist() == workload.arrival_s.tolist()


def test_workload_at_another_rate_is_the_same_trace_rescaled():
    slow, fast = _workload("h100-llama8b", 2.0, 30), _workload("h100-llama8b", 8.0, 30)
    assert np.allclose(slow.arrival_s, 4 * fast.arrival_s)
    assert (slow.output_tokens == fast.output_tokens).all()


def _burst(n: int, prompt: int, output: int, tpot_slo_ms: float) -> WorkloadArrays:
    """n requests arriving at time 0, the classes in turn, all of one shape."""
    return WorkloadArrays(
        ("coding", "chat", "summarization"),
        arrival_s=np.zeros(n),
        class_index=np.arange(n) % 3,
        prompt_tokens=np.full(n, prompt),
        output_tokens=np.full(n, output),
        tpot_slo_ms=np.full(n, tpot_slo_ms),
    )


def test_burst_at_time_zero_speculation_slower_without_acceptance_per_request():
    """All requests arrive together: every policy decodes the same batch, so with zero
    acceptance each request's TPOT is the mean iteration time, never below no speculation's."""
    workload = _burst(16, prompt=100, output=50, tpot_slo_ms=40.0)
    plain = _run("a100x4-llama70b", workload, "none", zero_acceptance())
    for policy in SPECULATIVE:
        spec = _run("a100x4-llama70b", workload, policy, zero_acceptance())
        assert (spec.tpot_ms >= plain.tpot_ms).all(), policy


@pytest.mark.parametrize("seed", [0, 3])  # seeds 0-4 give a coding gap of 0.47 to 0.66
def test_adaserve_serves_the_tight_class_better_than_static_under_mixed_load(seed):
    workload = _workload("a100x4-llama70b", 7.0, 200, seed=seed)
    coding = workload.class_index == workload.class_names.index("coding")
    static = _run("a100x4-llama70b", workload, "static", seed=seed)
    adaserve = _run("a100x4-llama70b", workload, "adaserve", seed=seed)
    assert adaserve.met[coding].mean() > static.met[coding].mean() + 0.2
    assert adaserve.met.mean() > static.met.mean()


@dataclass
class _PlainThenTwoChains:
    """Fake policy: a plain iteration, then two depth-2 chains verified whole, repeated; keeps
    what each speculative iteration saw and got."""

    name: str = "plain-then-chains"
    speculates: bool = True
    warm_draft: bool = False  # its plain iterations keep the draft extend
    prefill_draft: bool = True  # the draft prefills new requests
    iteration: int = 0
    seen: list = field(default_factory=list)  # (path probabilities [B, 2], accepted [B])

    def decide(self, slo, draft, *_batch) -> SimStep:
        self.iteration += 1
        n = slo.num_requests
        if self.iteration % 3 == 1:
            plain = np.ones(n, dtype=np.int64)
            return SimStep((), None, None, plain, warm_draft=self.warm_draft)
        trees = draft(2, 1)
        self.seen.append([trees.path_prob.copy(), None])
        return SimStep((n, n), trees, np.ones((n, 2), dtype=bool), np.full(n, 3), 2, 1)

    def draft_prefills(self, new_requests: int) -> bool:
        return self.prefill_draft

    def observe(self, step, accept_lens, latency_ms, verify_ms, *_rest) -> None:
        if step.trees is not None:
            self.seen[-1][1] = accept_lens - 1  # draft tokens accepted


def test_a_draft_after_a_plain_iteration_runs_on_stale_state():
    """As SGLang's steps-0 path (draft extend skipped, top-k zeroed): the first draft after a
    plain iteration has path probability 0 and accepts nothing; the next one is whole again."""
    certain = SYNTHETIC_DEFAULT.with_calibration("always", (0.0, 1.0), (1.0, 1.0))
    workload = _burst(4, prompt=10, output=40, tpot_slo_ms=np.nan)
    policy = _PlainThenTwoChains()
    latency = get_preset("h100-llama8b")
    simulate(workload, latency, certain, policy, 0, EngineConfig())
    after_plain, after_draft = policy.seen[0::2], policy.seen[1::2]
    assert len(after_plain) >= 5 and len(after_draft) >= 5
    for path_prob, accepted in after_plain:
        assert (path_prob == 0).all() and (accepted == 0).all()
    for path_prob, accepted in after_draft:
        assert (path_prob > 0).all() and (accepted == 2).all()
    # SGLang's own adaptive steps 0 keeps the draft extend: nothing is stale after it.
    warm = _PlainThenTwoChains(warm_draft=True)
    simulate(workload, latency, certain, warm, 0, EngineConfig())
    assert all((accepted == 2).all() for _, accepted in warm.seen)


def test_a_request_prefilled_without_the_draft_is_blind_to_it_for_life():
    """As the server's prefill without the draft extend (`blind_prefill`): the prefill costs
    the target's alone, and every draft of those requests reads path probability 0 and
    accepts nothing, even right after a draft."""
    certain = SYNTHETIC_DEFAULT.with_calibration("always", (0.0, 1.0), (1.0, 1.0))
    workload = _burst(4, prompt=10, output=40, tpot_slo_ms=np.nan)
    latency = get_preset("h100-llama8b")
    blind = _PlainThenTwoChains(warm_draft=True, prefill_draft=False)
    blind_run = simulate(workload, latency, certain, blind, 0, EngineConfig())
    assert len(blind.seen) >= 10
    assert all((f == 0).all() and (accepted == 0).all() for f, accepted in blind.seen)
    plain_run = simulate(workload, latency, certain, make_policy("none", 64, 7.0), 0)
    warm_run = simulate(workload, latency, certain, _PlainThenTwoChains(warm_draft=True), 0)
    assert blind_run.prefill_ms == pytest.approx(plain_run.prefill_ms)
    assert blind_run.prefill_ms < warm_run.prefill_ms


def test_adaserve_prefills_without_the_draft_where_speculation_never_pays():
    """With a draft that pays for nothing (`poor-draft`), adaserve stands down and, once it
    knows, prefills new requests without the draft: its prefills cost about what no
    speculation's do, where static pays the draft's prefill on every prompt."""
    poor = resolve_acceptance("poor-draft")
    workload = _workload("h100-llama8b", 8.0, 120, seed=1)
    plain, static, ada = (
        _run("h100-llama8b", workload, p, poor) for p in ("none", "static", "adaserve")
    )
    assert ada.draft_blind.mean() > 0.5
    assert ada.prefill_ms - plain.prefill_ms < 0.3 * (static.prefill_ms - plain.prefill_ms)
    assert (ada.committed == workload.output_tokens).all()


@dataclass
class _StallRecorder:
    """No speculation, keeping each iteration's batch size and the prefill time it waited."""

    inner: object
    stalls: list = field(default_factory=list)  # (running requests, stall ms)

    def __post_init__(self) -> None:
        self.name, self.speculates = self.inner.name, self.inner.speculates

    def decide(self, slo, *rest) -> SimStep:
        self._running = slo.num_requests
        return self.inner.decide(slo, *rest)

    def draft_prefills(self, new_requests: int) -> bool:
        return self.inner.draft_prefills(new_requests)

    def observe(self, step, accept_lens, latency_ms, verify_ms, deepest=None, after_prefill=False,
                stall_ms=0.0) -> None:  # fmt: skip
        self.stalls.append((self._running, stall_ms))


def test_requests_running_through_a_prefill_report_the_wait():
    """The server's `LoopClock.stall_ms`: a request arriving while another decodes is
    prefilled between two of its iterations, and the next iteration reports that prefill's
    time; the first request's own prefill, with nothing running, stalls no one."""
    workload = WorkloadArrays(
        ("coding", "chat", "summarization"),
        arrival_s=np.array([0.0, 0.05]),
        class_index=np.zeros(2, dtype=np.int64),
        prompt_tokens=np.full(2, 2000),
        output_tokens=np.full(2, 100),
        tpot_slo_ms=np.full(2, np.nan),
    )
    latency = get_preset("h100-llama8b")
    recorder = _StallRecorder(make_policy("none", 64, latency.baseline_tpot_ms))
    result = simulate(workload, latency, SYNTHETIC_DEFAULT, recorder, 0, EngineConfig())
    stalled = [(n, ms) for n, ms in recorder.stalls if ms > 0]
    assert len(stalled) == 1 and stalled[0][0] == 2
    assert stalled[0][1] == pytest.approx(latency.prefill_ms(2000, False))
    assert result.prefill_batches == 2


@dataclass
class _ClockRecorder(_StallRecorder):
    """`_StallRecorder` that keeps what each iteration's requests had spent on their SLO clock."""

    elapsed_ms: list = field(default_factory=list)

    def decide(self, slo, *rest) -> SimStep:
        self.elapsed_ms.append(slo.decode_elapsed_ms.tolist())
        return super().decide(slo, *rest)


def test_the_wait_for_the_first_decode_iteration_counts_in_tpot_and_on_the_slo_clock():
    """Prefills run before decode iterations: a request whose prefill ends as a long prompt
    arrives waits for that prompt's prefill before its first decode iteration. Its client
    (and SGLang) measures TPOT from its first token, so the wait is in its TPOT, and the
    policy's SLO clock has run for it at that first iteration."""
    workload = WorkloadArrays(
        ("coding", "chat", "summarization"),
        arrival_s=np.array([0.0, 1e-6]),
        class_index=np.zeros(2, dtype=np.int64),
        prompt_tokens=np.array([16, 8000]),
        output_tokens=np.array([11, 11]),
        tpot_slo_ms=np.full(2, 15.0),  # met by ten decode iterations alone, not with the wait
    )
    latency = get_preset("h100-llama8b")
    recorder = _ClockRecorder(make_policy("none", 64, latency.baseline_tpot_ms))
    result = simulate(workload, latency, SYNTHETIC_DEFAULT, recorder, 0, EngineConfig())
    long_prefill_ms = latency.prefill_ms(8000, False)
    assert long_prefill_ms > 100.0
    # Request 0's first decode iteration runs after request 1's prefill: its clock shows it.
    assert recorder.elapsed_ms[0][0] == pytest.approx(long_prefill_ms)
    assert recorder.elapsed_ms[0][1] == pytest.approx(0.0)
    # Ten decode iterations each, together: request 0's TPOT carries the wait, over 10 tokens.
    gap_ms = result.tpot_ms[0] - result.tpot_ms[1]
    assert gap_ms == pytest.approx(long_prefill_ms / 10)
    assert not result.met[0] and result.met[1]


@dataclass
class _SlowPolicy:
    """No speculation, spending `decide_s` of wall time in each decide and `observe_s` in each
    observe (the simulator's own draft trees excluded), and keeping the latencies it observes."""

    inner: object
    decide_s: float
    observe_s: float
    observed_ms: list = field(default_factory=list)
    critical_s: float = 0.001  # of decide_s, between the draft and the verify

    def __post_init__(self) -> None:
        self.name, self.speculates = self.inner.name, self.inner.speculates

    def decide(self, *args) -> SimStep:
        _busy(self.decide_s)
        return self.inner.decide(*args)

    def draft_prefills(self, new_requests: int) -> bool:
        return self.inner.draft_prefills(new_requests)

    def observe(self, step, accept_lens, latency_ms, *rest) -> None:
        _busy(self.observe_s)
        self.observed_ms.append(latency_ms)
        self.inner.observe(step, accept_lens, latency_ms, *rest)


class _HostClock:
    """The simulator's host clock, advanced only by the policy's `_busy` time."""

    now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


_CLOCK = _HostClock()


def _busy(seconds: float) -> None:
    _CLOCK.now_s += seconds


def test_a_charged_policy_pays_its_own_time_on_the_simulated_clock(monkeypatch):
    """`EngineConfig.policy_time_scale`: the policy's decide time lands inside the iteration
    it observes (as on a server, where the iteration's clock runs around the policy's calls)
    and its observe time after it, both on the clock; uncharged, the clock ignores them."""
    workload = WorkloadArrays(
        ("coding", "chat", "summarization"),
        arrival_s=np.array([0.0]),
        class_index=np.zeros(1, dtype=np.int64),
        prompt_tokens=np.full(1, 100),
        output_tokens=np.full(1, 21),
        tpot_slo_ms=np.full(1, np.nan),
    )
    latency = get_preset("h100-llama8b")
    monkeypatch.setattr(engine, "host_clock", _CLOCK)

    def run(scale: float, critical_path: str | None = None) -> tuple:
        slow = _SlowPolicy(make_policy("none", 64, latency.baseline_tpot_ms), 0.004, 0.002)
        config = EngineConfig(policy_time_scale=scale, charge_critical_path=critical_path)
        result = simulate(workload, latency, SYNTHETIC_DEFAULT, slow, 0, config)
        return result, slow.observed_ms

    plain, plain_ms = run(0.0)
    charged, charged_ms = run(0.5)
    iterations = plain.iterations
    assert iterations == charged.iterations == 20 and plain.policy_ms == 0.0
    # Decide: 4 ms of host time at scale 0.5, inside each observed iteration.
    extra = np.array(charged_ms) - np.array(plain_ms)
    assert extra == pytest.approx(np.full(iterations, 2.0))
    # The clock pays decide and observe: (4 + 2) x 0.5 ms per iteration.
    decode_s = charged.finish_s[0] - plain.finish_s[0]
    assert decode_s == pytest.approx(iterations * 0.003)
    assert charged.policy_ms == pytest.approx(1000 * decode_s, rel=1e-6)
    with pytest.raises(ValueError, match="policy_time_scale"):
        EngineConfig(policy_time_scale=-1.0)
    # Charging the critical path only: of each iteration, the `critical_s` its decision spent
    # between the draft and the verify (here 1 ms of the 4), nothing of observe.
    critical, critical_ms = run(0.5, critical_path="decide")
    extra = np.array(critical_ms) - np.array(plain_ms)
    assert extra == pytest.approx(np.full(iterations, 0.5))
    decode_s = critical.finish_s[0] - plain.finish_s[0]
    assert decode_s == pytest.approx(iterations * 0.0005)
    with pytest.raises(ValueError, match="charge_critical_path"):
        EngineConfig(charge_critical_path="all")


def test_a_decision_shorter_than_its_draft_costs_the_clock_nothing_past_the_draft(
    monkeypatch,
):
    """`charge_critical_path="past-draft"`: a decision that reads nothing of the device runs
    on the host while the draft's kernels run, so only what outlasts the draft is charged."""
    workload = _burst(2, 100, 30, np.nan)
    latency = get_preset("h100-llama8b")
    monkeypatch.setattr(engine, "host_clock", _CLOCK)

    def run(charge: str | None, critical_s: float) -> list:
        static = make_policy("static", 64, latency.baseline_tpot_ms)
        slow = _SlowPolicy(static, critical_s, 0.0, critical_s=critical_s)
        config = EngineConfig(policy_time_scale=1.0 if charge else 0.0, charge_critical_path=charge)
        simulate(workload, latency, SYNTHETIC_DEFAULT, slow, 0, config)
        return slow.observed_ms

    uncharged = np.array(run(None, 0.0))
    short = 0.1 * latency.draft_step_ms(2, 200) / 1000  # a tenth of one draft step, in s
    assert np.array(run("past-draft", short)) == pytest.approx(uncharged)
    assert np.array(run("decide", short)) - uncharged == pytest.approx(1000 * short)
    # Far longer than the draft: the device idles for all but the draft's time.
    long = 0.050
    past = np.array(run("past-draft", long)) - uncharged
    assert np.all((past > 0) & (past < 1000 * long))


def test_a_fixed_decision_charge_lands_on_each_decided_iteration(monkeypatch):
    """`EngineConfig.decision_ms`: each iteration that drafted (and so decided) pays the fixed
    charge times the scale, whatever the host's clock says; plain iterations pay nothing."""
    workload = _burst(2, 100, 30, np.nan)
    latency = get_preset("h100-llama8b")
    monkeypatch.setattr(engine, "host_clock", _CLOCK)

    def run(name: str, config: EngineConfig) -> tuple:
        policy = make_policy(name, 64, latency.baseline_tpot_ms)
        slow = _SlowPolicy(policy, 0.002, 0.0, critical_s=0.002)  # the clock's 2 ms ignored
        result = simulate(workload, latency, SYNTHETIC_DEFAULT, slow, 0, config)
        return result, np.array(slow.observed_ms)

    uncharged, uncharged_ms = run("static", EngineConfig())
    fixed = EngineConfig(policy_time_scale=0.5, charge_critical_path="decide", decision_ms=0.3)
    charged, charged_ms = run("static", fixed)
    assert charged.iterations == uncharged.iterations
    assert charged_ms - uncharged_ms == pytest.approx(0.15)  # 0.3 ms x 0.5, every iteration
    assert charged.policy_ms == pytest.approx(0.15 * charged.iterations)
    _, plain_ms = run("none", fixed)  # never drafts: nothing charged
    assert plain_ms == pytest.approx(run("none", EngineConfig())[1])
    with pytest.raises(ValueError, match="charge_critical_path"):
        EngineConfig(policy_time_scale=1.0, decision_ms=0.3)
    with pytest.raises(ValueError, match="decision_ms"):
        EngineConfig(charge_critical_path="decide", decision_ms=-1.0)


def test_a_server_policy_times_its_decision_between_draft_and_verify(monkeypatch):
    """`ServerPolicy.critical_s`: the host time of the policy's `decide` alone, not of the
    plan before the draft nor of the draft itself."""
    monkeypatch.setattr(engine, "host_clock", _CLOCK)
    server = make_policy("adaserve", 64, get_preset("h100-llama8b").baseline_tpot_ms)
    inner = server.policy

    def plan(*args):
        _busy(0.003)
        return 2, 2

    def decide(it):
        _busy(0.001)
        return type(inner).decide(inner, it)

    monkeypatch.setattr(inner, "draft_shape", plan)
    monkeypatch.setattr(inner, "decide", decide)
    rng = np.random.default_rng(0)
    alpha, beta = np.full(2, 2.0), np.full(2, 2.0)
    slo = SloBatch(
        tpot_slo_ms=torch.tensor([50.0, 50.0], dtype=torch.float64),
        decode_elapsed_ms=torch.zeros(2, dtype=torch.float64),
        tokens_out=torch.zeros(2, dtype=torch.float64),
    )

    def draft(depth, width):
        _busy(0.010)
        return draft_trees(SYNTHETIC_DEFAULT, rng, alpha, beta, depth, width)

    server.decide(slo, draft, ("a", "b"), np.array([100, 100]))
    assert server.critical_s == pytest.approx(0.001)


@pytest.mark.parametrize("policy", ["adaserve", "tetris"])
def test_policies_run_in_inference_mode_and_serve_as_outside_it(policy, monkeypatch):
    # The drivers make a policy's calls in torch's inference mode (`policy_calls`) for speed
    # alone: a loaded run serves every request exactly as with the calls in plain torch, and
    # what the policy keeps across calls was built in that mode.
    import contextlib

    from sgl_adaspec.speculative import driver

    workload = _workload("h100-llama8b", 40.0, 60)
    latency = get_preset("h100-llama8b")
    budget = knee_budget(latency.verify_profile())

    def serve():
        adapter = make_policy(policy, budget, latency.baseline_tpot_ms)
        result = simulate(workload, latency, SYNTHETIC_DEFAULT, adapter, 0, EngineConfig())
        return result, adapter.policy

    in_mode, kept = serve()
    monkeypatch.setattr(driver, "policy_calls", contextlib.nullcontext)
    outside, plain_kept = serve()
    assert in_mode.iterations == outside.iterations > 0
    assert in_mode.accepted_drafts == outside.accepted_drafts > 0
    np.testing.assert_array_equal(in_mode.finish_s, outside.finish_s)
    state = kept.acceptance._trials  # the calibration's counts: replaced at every outcome
    assert state.is_inference() and not plain_kept.acceptance._trials.is_inference()
