"""The iteration driver the server's hooks and the simulator share (`speculative/driver.py`), and
the hooks' planning through it (`sgl_adaspec/adapters/speculative/hooks.py`, `_plan`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sgl_adaspec.adapters.speculative import hooks, request_state
from sgl_adaspec.adapters.speculative.tp_sync import TpSync
from sgl_adaspec.scheduler.slo import SloBatch
from sgl_adaspec.sim.policies import ServerPolicy
from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.driver import DraftPlan, IterationDriver, VerifyResult
from sgl_adaspec.speculative.policies.base import PolicyBase
from sgl_adaspec.speculative.policies.tetris import TetrisPolicy
from tests.speculative.policy_inputs import iteration_input
from tests.speculative.test_tp_sync import FakeGroup


@dataclass(kw_only=True)
class Scripted(PolicyBase):
    """Draft shapes from a script; records what it is asked and what it observes."""

    shapes: list = field(default_factory=list)
    warm: bool = True
    asked: list = field(default_factory=list)
    ran: list = field(default_factory=list)
    outcomes: list = field(default_factory=list)

    def draft_shape(self, num_requests, steps, topk, slo=None):
        self.asked.append((num_requests, steps, topk, slo))
        return self.shapes.pop(0)

    def draft_runs(self, depth, width):
        self.ran.append((depth, width))

    def keep_draft_warm(self) -> bool:
        return self.warm

    def decide(self, it):
        return TetrisPolicy().decide(it)

    def observe(self, outcome) -> None:
        self.outcomes.append(outcome)


def _slo(n: int) -> SloBatch:
    zeros = torch.zeros(n, dtype=torch.float64)
    return SloBatch(tpot_slo_ms=torch.full((n,), 50.0, dtype=torch.float64),
                    decode_elapsed_ms=zeros, tokens_out=zeros)  # fmt: skip


def _result(n: int, accept_lens: list[int]) -> VerifyResult:
    return VerifyResult(
        accept_lens=torch.tensor(accept_lens), verify_ms=5.0, iteration_ms=8.0,
        rids=tuple(f"r{i}" for i in range(n)), context_tokens=100 * n,
    )  # fmt: skip


def test_a_plan_keeps_the_draft_warm_only_when_it_drafts_nothing():
    policy = Scripted(shapes=[(0, 0), (3, 2)])
    driver = IterationDriver(policy)
    slo = _slo(2)
    assert driver.plan(2, (4, 2), slo) == DraftPlan(0, 0, True, slo)
    plan = driver.plan(2, (4, 2), slo)
    assert (plan.depth, plan.width, plan.keep_warm, plan.plain) == (3, 2, False, False)
    assert policy.asked == [(2, 4, 2, slo)] * 2


def test_observe_reports_accept_lengths_once_and_the_first_decided_draft_as_warm_up():
    policy = Scripted(shapes=[(0, 0), (2, 1), (2, 1)])
    ticks = iter([0.0, 0.004, 1.0, 1.002])
    driver = IterationDriver(policy, clock=lambda: next(ticks))
    plain = driver.plan(2, (2, 1), _slo(2))
    [first] = driver.observe(plain, _result(2, [1, 1]))
    assert not first.speculated and not first.warm_up and first.draft_kept
    assert policy.stats.plain_iterations == 1
    cands = Candidates(
        tokens=torch.tensor([[5, 6], [7, 8]]), parents=torch.tensor([[-1, 0], [-1, 0]]),
        path_prob=torch.tensor([[0.9, 0.5], [0.8, 0.1]]), valid=torch.ones(2, 2, dtype=torch.bool),
    )  # fmt: skip
    for expected_warm_up, expected_s in ((True, 0.004), (False, 0.002)):
        plan = driver.plan(2, (2, 1), _slo(2))
        it = iteration_input(cands, 2, tpot_slo_ms=[50.0, 50.0])
        decision = driver.decide(it)
        assert driver.critical_s == pytest.approx(expected_s)
        [outcome] = driver.observe(plan, _result(2, [3, 1]), it, decision)
        assert outcome.warm_up is expected_warm_up and outcome.speculated
        assert outcome.accepted.tolist() == [3, 1]  # bonus included, as given
    assert [o.warm_up for o in policy.outcomes] == [False, True, False]


class _Raising(Scripted):
    def observe(self, outcome) -> None:
        raise RuntimeError("the policy's observe fails")


def test_the_callers_bookkeeping_stands_when_the_policys_observe_raises():
    # The server counts the raise as a fallback and goes on: the requests' committed tokens
    # must still be recorded (`VerifyResult.on_taken`), or their SLO clocks fall behind.
    driver, taken = IterationDriver(_Raising(shapes=[(0, 0)])), []
    plan = driver.plan(2, (2, 1), _slo(2))
    result = dataclasses.replace(_result(2, [1, 1]), on_taken=taken.append)
    with pytest.raises(RuntimeError, match="observe fails"):
        driver.observe(plan, result)
    assert [outcome.accepted.tolist() for outcome in taken] == [[1, 1]]


def test_the_simulator_drives_server_policies_through_the_driver(monkeypatch):
    """What the simulator's engine commits (accepted drafts + the bonus) is what the policy's
    outcome says, as SGLang's accept_lens on the server."""
    seen = []
    original = IterationDriver.observe

    def observe(self, plan, result, it=None, decision=None):
        outcomes = original(self, plan, result, it, decision)
        seen.extend((plan, outcome) for outcome in outcomes)
        return outcomes

    monkeypatch.setattr(IterationDriver, "observe", observe)
    server = ServerPolicy(Scripted(shapes=[(0, 0), (2, 1)]), "scripted", depth=2, width=1)
    step = server.decide(_slo(2), None, ("a", "b"), np.array([10, 20]))
    assert step.trees is None
    server.observe(step, np.array([1, 1]), 6.0, 4.0)
    step = server.decide(_slo(2), _ChainDrafter(), ("a", "b"), np.array([10, 20]))
    server.observe(step, np.array([3, 2]), 9.0, 7.0)
    (plain, plain_outcome), (drafted, outcome) = seen
    assert plain.plain and plain_outcome.accepted.tolist() == [1, 1]
    assert drafted == DraftPlan(2, 1, False, drafted.slo)
    assert outcome.accepted.tolist() == [3, 2] and outcome.context_tokens == 30
    assert not outcome.warm_up  # a simulated first draft pays no one-off set-up


@pytest.mark.parametrize(("planned_shape", "drafted", "told"), [(True, (2, 1), []),
                                                                 (False, (3, 2), [(3, 2)])])
def test_the_simulator_drafts_and_tells_the_shape_the_draft_runs(planned_shape, drafted, told):
    drafts = []

    def drafter(depth, width):
        drafts.append((depth, width))
        return _ChainDrafter()(depth, width)

    policy = Scripted(shapes=[(2, 1)])
    server = ServerPolicy(policy, "scripted", depth=3, width=2, planned_shape=planned_shape)
    server.decide(_slo(2), drafter, ("a", "b"), np.array([10, 20]))
    assert drafts == [drafted] and policy.ran == told


@pytest.mark.parametrize("promise", [True, False])
def test_the_simulators_candidates_promise_a_layout_only_where_asked(promise):
    seen = []

    @dataclass(kw_only=True)
    class Seeing(Scripted):
        def decide(self, it):
            seen.append(it.cands.beam)
            return super().decide(it)

    server = ServerPolicy(Seeing(shapes=[(2, 1)]), "seeing", depth=2, width=1,
                          layout_promise=promise)  # fmt: skip
    server.decide(_slo(2), _ChainDrafter(), ("a", "b"), np.array([10, 20]))
    assert seen == [(2, 1) if promise else None]  # None: as the SGLang adapter's trees


def _cands() -> Candidates:
    return Candidates(
        tokens=torch.tensor([[5, 6], [7, 8]]), parents=torch.tensor([[-1, 0], [-1, 0]]),
        path_prob=torch.tensor([[0.9, 0.5], [0.8, 0.1]]), valid=torch.ones(2, 2, dtype=torch.bool),
    )  # fmt: skip


@dataclass(kw_only=True)
class Noting(Scripted):
    """Notes each launched iteration by its number and whether it left the draft warm."""

    launched: list = field(default_factory=list)

    def iteration_launched(self, warm):
        self.launched.append(warm)
        return len(self.launched)


def test_with_a_lag_of_one_an_outcome_comes_after_the_next_iteration_with_its_note():
    """Iteration t's outcome reaches the policy when t + 1 ends, before t + 2 is planned, and
    carries what the policy noted when t launched (later launches did not overwrite it)."""
    policy = Noting(shapes=[(2, 1), (0, 0), (2, 1)], warm=False)
    driver = IterationDriver(policy, observe_lag=1)
    taken = []
    for accepted in ([3, 1], [1, 1], [2, 2]):
        plan = driver.plan(2, (2, 1), _slo(2))
        assert len(policy.outcomes) == max(len(taken) - 1, 0)  # ended ones but the last
        it = decision = None
        if not plan.plain:
            it = iteration_input(_cands(), 2, tpot_slo_ms=[50.0, 50.0])
            decision = driver.decide(it)
        taken.append(driver.observe(plan, _result(2, accepted), it, decision))
    assert [len(t) for t in taken] == [0, 1, 1]
    assert policy.launched == [True, False, True]  # at each end, not at the lagged observe
    first, second = policy.outcomes
    assert (first.note, first.accepted.tolist(), first.speculated) == (1, [3, 1], True)
    assert (second.note, second.speculated, second.draft_kept) == (2, False, False)
    assert [o.note for o in driver.take()] == [3]  # the last, taken on demand


def test_a_finished_request_is_forgotten_only_after_its_last_outcome_is_taken():
    forgotten = []
    policy = Scripted(shapes=[(0, 0), (0, 0)])
    policy.forget = forgotten.append
    driver = IterationDriver(policy, observe_lag=1)
    driver.observe(driver.plan(2, (2, 1), _slo(2)), _result(2, [1, 1]))
    driver.forget("r1")  # its outcome still waits
    driver.forget("gone")
    assert forgotten == ["gone"]
    driver.observe(driver.plan(1, (2, 1), _slo(1)), _result(1, [1]))  # takes the first
    assert forgotten == ["gone", "r1"]


def test_the_copies_an_outcome_holds_do_not_follow_reused_buffers():
    """The iteration's tensors are copied as it ends: SGLang reuses its buffers next iteration."""
    policy = Scripted(shapes=[(0, 0)])
    driver = IterationDriver(policy, observe_lag=1)
    buffer = torch.tensor([1, 1])
    result = _result(2, [1, 1])
    result = VerifyResult(buffer, 5.0, 8.0, result.rids, result.context_tokens)
    driver.observe(driver.plan(2, (2, 1), _slo(2)), result)
    buffer.fill_(7)
    [outcome] = driver.take()
    assert outcome.accepted.tolist() == [1, 1]


def test_a_lag_other_than_zero_or_one_is_refused():
    with pytest.raises(ValueError, match="observe_lag must be 0 or 1"):
        IterationDriver(Scripted(), observe_lag=2)


class _ChainDrafter:
    def __call__(self, depth, width):
        from sgl_adaspec.sim.acceptance import SYNTHETIC_DEFAULT
        from sgl_adaspec.sim.trees import draft_trees

        rng = np.random.default_rng(0)
        alpha = beta = np.full(2, 2.0)
        return draft_trees(SYNTHETIC_DEFAULT, rng, alpha, beta, depth, width)


class _Tiers:
    def __init__(self, covering, warm):
        self._covering, self.warm = covering, warm

    def covering(self, shape):
        return self._covering


@pytest.mark.parametrize(
    ("shape", "tiers", "expected"),
    [
        ((3, 2), None, (4, 2, False)),  # no tiers: the configured search runs
        ((3, 2), _Tiers((3, 2), True), (3, 2, False)),
        ((1, 1), _Tiers((2, 1), True), (2, 1, False)),  # the built tier that covers it
        ((0, 0), _Tiers(None, True), (0, 0, True)),
        ((0, 0), _Tiers(None, False), (0, 0, False)),  # no steps-0 tier: cold
        ((0, 0), None, (0, 0, False)),
    ],
)
def test_the_hooks_run_the_plan_in_a_built_tier(monkeypatch, shape, tiers, expected):
    """...and the policy is told, before the draft, the shape it runs where that is not the
    one it asked for."""
    monkeypatch.setattr(request_state, "slo_batch", lambda reqs, policy, base: _slo(len(reqs)))
    monkeypatch.setattr(hooks, "warm_shape", lambda t: (0, 2) if t is not None and t.warm else None)
    monkeypatch.setattr(hooks, "needs_draft_probs", lambda info: False)
    driver = IterationDriver(Scripted(shapes=[shape]))
    state = SimpleNamespace(tp_sync=TpSync(), tiers=tiers)
    batch = SimpleNamespace(reqs=[object(), object()], sampling_info=None)
    plan = hooks._plan(driver, state, batch, (4, 2))
    assert (plan.depth, plan.width, plan.keep_warm) == expected
    assert plan.slo is not None and plan.slo.num_requests == 2
    assert driver.policy.ran == ([] if expected[:2] == shape else [expected[:2]])


def test_a_follower_rank_runs_the_plan_rank_0_sent_without_asking_its_policy():
    policy = Scripted(shapes=[])
    state = SimpleNamespace(tp_sync=TpSync(FakeGroup(1, from_rank_0=(2, 1, False))), tiers=None)
    batch = SimpleNamespace(reqs=[object()], sampling_info=None)
    plan = hooks._plan(IterationDriver(policy), state, batch, (4, 2))
    assert (plan.depth, plan.width, plan.keep_warm, plan.slo) == (2, 1, False, None)
    assert policy.asked == []


@pytest.mark.parametrize(
    ("flag", "device", "disable_overlap", "expected"),
    [
        ("auto", "cuda", False, 1),  # the overlap schedule launches t + 1 before t is read
        ("auto", "cuda", True, 0),
        ("auto", "cpu", False, 0),  # the CPU's device work is done when the host reads it
        ("1", "cpu", False, 1),
        ("0", "cuda", False, 0),
    ],
)
def test_the_servers_observe_lag(flag, device, disable_overlap, expected):
    from sgl_adaspec.adapters.speculative.runtime import observe_lag
    from sgl_adaspec.config import AdaspecConfig

    worker = SimpleNamespace(
        server_args=SimpleNamespace(device=device, disable_overlap_schedule=disable_overlap)
    )
    config = AdaspecConfig.of(spec_policy="adaserve", spec_observe_lag=flag)
    assert observe_lag(config, worker) == expected
