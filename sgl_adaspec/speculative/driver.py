"""One speculative iteration as the server and the simulator drive a policy through it: plan the
draft, decide on its candidates, observe the outcome once.

The SGLang hooks (`adapters/speculative/hooks.py`) and the simulator (`sim/policies.py`) call
these three and nothing else of the policy's iteration: they translate their own values to
`DraftPlan`, `IterationInput` and `VerifyResult`, and back.

With `observe_lag` 1 the policy takes iteration t's outcome when t + 2 is planned: under an
overlap scheduler iteration t + 1 is planned while t's device work runs, so its plan cannot
wait for t's outcome; t's results are copied to the host without waiting as t ends
(`host_copy`) and read once landed. What the policy decided for t travels with the outcome
(`PolicyBase.iteration_launched`), so later plans do not overwrite it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from sgl_adaspec.scheduler.slo import SloBatch
from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.host_copy import copies_landed, to_host, wait_for
from sgl_adaspec.speculative.policies.base import (
    Decision,
    IterationInput,
    Outcome,
    PolicyBase,
    make_outcome,
    policy_calls,
)


@dataclass(frozen=True)
class DraftPlan:
    """What the policy asks of the draft before it runs.
    - depth x width: the beam search (depth 0: a plain decode);
    - keep_warm: a plain iteration still runs the draft extend (`PolicyBase.keep_draft_warm`);
    - slo: the running requests' SLO state it was planned for (None: not known yet)."""

    depth: int
    width: int
    keep_warm: bool = False
    slo: SloBatch | None = None

    @property
    def plain(self) -> bool:
        return self.depth == 0


@dataclass(frozen=True)
class VerifyResult:
    """What an iteration returned (B running requests); its tensors may sit on the device.
    - accept_lens [B] int: tokens each request committed, bonus included (SGLang's
      `accept_lens`; 1 each in a plain iteration), or None where the verify reported none;
    - verify_ms: the verify pass (the decode forward in a plain iteration); iteration_ms: the
      whole iteration;
    - deepest_accepted [B] int: each request's deepest accepted candidate node (-1: none),
      None when unknown, or a function of the decided candidates that computes it on the host
      once the copies landed;
    - the rest as `Outcome`'s fields of the same names."""

    accept_lens: torch.Tensor | None
    verify_ms: float
    iteration_ms: float
    rids: tuple[str, ...]
    context_tokens: int
    deepest_accepted: torch.Tensor | Callable[[Candidates], torch.Tensor | None] | None = None
    early_exit: tuple[int, int, float] | None = None
    after_prefill: bool = False
    stall_ms: float = 0.0
    verify_as_decode: bool = False
    # Called with the outcome when the policy takes it: the caller's bookkeeping of the
    # iteration's results, on the host.
    on_taken: Callable[[Outcome], None] | None = None

    def to_host(self) -> VerifyResult:
        """The same result on its way to the host (`host_copy`); a deferred
        `deepest_accepted` stays for `settled`."""
        lens, deepest = self.accept_lens, self.deepest_accepted
        return replace(
            self,
            accept_lens=None if lens is None else to_host(lens),
            deepest_accepted=to_host(deepest) if isinstance(deepest, torch.Tensor) else deepest,
        )

    def settled(self, cands: Candidates | None) -> VerifyResult:
        """Once its copies landed: a deferred `deepest_accepted` computed on the host from the
        decided candidates' host copy `cands`."""
        if callable(self.deepest_accepted):
            return replace(self, deepest_accepted=self.deepest_accepted(cands))
        return self


@dataclass(frozen=True)
class _Ended:
    """An iteration on its way to the host: what `make_outcome` takes, copied as the iteration
    ended; `landed`: the copies' event."""

    plan: DraftPlan
    result: VerifyResult
    it: IterationInput | None
    decision: Decision | None
    warm_up: bool
    draft_stale: bool
    note: object
    landed: object


@dataclass
class IterationDriver:
    """Drives one policy through its iterations (`plan`, then `decide` if the plan drafts, then
    `observe`). It keeps what spans iterations on the caller's side of the policy: whether a
    decided iteration was observed yet (on a server the first is the warm-up, `Outcome.warm_up`:
    `first_draft_warms_up`), the host time of the last decision (`critical_s`: what the
    verify waited on), and the outcomes the policy has yet to take (`observe_lag`)."""

    policy: PolicyBase
    clock: Callable[[], float] = time.perf_counter
    # False in the simulator: its first speculative iteration pays no one-off set-up.
    first_draft_warms_up: bool = True
    # Iterations an outcome waits before the policy takes it: 0, at the iteration's end; 1,
    # when the iteration after next is planned (an overlap scheduler's, module docstring).
    observe_lag: int = 0
    critical_s: float = 0.0
    _decided_observed: bool = field(default=False, repr=False)
    _waiting: deque = field(default_factory=deque, repr=False)  # of _Ended, oldest first
    _forget: set = field(default_factory=set, repr=False)  # rids to forget once taken

    def __post_init__(self) -> None:
        if self.observe_lag not in (0, 1):
            raise ValueError(f"observe_lag must be 0 or 1, not {self.observe_lag}")

    def plan(
        self,
        num_requests: int,
        configured: tuple[int, int],
        slo: SloBatch | None,
        can_keep_warm: bool = True,
        runs_in: Callable[[tuple[int, int]], tuple[int, int]] | None = None,
    ) -> DraftPlan:
        """The draft's shape within the configured search (steps, topk); `can_keep_warm`:
        whether a plain iteration can keep the draft's state here; `runs_in`: the shape a
        draft asked for runs in (a server's covering draft tier, or the configured search;
        None: the one asked for), which the policy is told before the draft
        (`PolicyBase.draft_runs`). Outcomes older than the lag are taken first."""
        self.critical_s = 0.0
        self.take(keep=self.observe_lag)
        with policy_calls():
            depth, width = self.policy.draft_shape(num_requests, *configured, slo)
            keep_warm = depth == 0 and can_keep_warm and self.policy.keep_draft_warm()
            runs = (depth, width) if depth == 0 or runs_in is None else runs_in((depth, width))
            if runs != (depth, width):
                depth, width = runs
                self.policy.draft_runs(depth, width)
        return DraftPlan(depth, width, keep_warm, slo)

    def draft_prefills(self, new_requests: int) -> bool:
        with policy_calls():
            return self.policy.draft_prefills(new_requests)

    def decide(self, it: IterationInput) -> Decision:
        """The nodes to verify; raises what the policy raised (the caller falls back)."""
        started = self.clock()
        with policy_calls():
            decision = self.policy.decide(it)
        self.critical_s = self.clock() - started
        return decision

    def observe(
        self,
        plan: DraftPlan,
        result: VerifyResult,
        it: IterationInput | None = None,
        decision: Decision | None = None,
    ) -> list[Outcome]:
        """The iteration ended (`it` and `decision`: those of a decided draft; None for a plain
        iteration): its outcome starts for the host, and the outcomes the policy takes now
        are returned (this one's unless the lag holds it)."""
        if plan.plain:
            self.policy.stats.observe_plain(len(result.rids), plan.keep_warm)
        warm_up = decision is not None and not self._decided_observed
        self._decided_observed |= warm_up
        warm_up &= self.first_draft_warms_up
        with policy_calls():
            stale = decision is not None and self.policy.draft_is_stale()
            note = self.policy.iteration_launched(not plan.plain or plan.keep_warm)
        lens = result.accept_lens
        device = None if lens is None else lens.device
        if decision is not None:
            device = decision.selection.mask.device
            it, decision = it.to_host(), decision.to_host()
        ended = _Ended(plan, result.to_host(), it, decision, warm_up, stale, note, None)
        self._waiting.append(replace(ended, landed=copies_landed(device)))
        return self.take(keep=self.observe_lag)

    def take(self, keep: int = 0) -> list[Outcome]:
        """The policy takes every waiting outcome but the newest `keep`, oldest first."""
        taken = []
        while len(self._waiting) > keep:
            ended = self._waiting.popleft()
            wait_for(ended.landed)
            result = ended.result.settled(ended.it.cands if ended.it is not None else None)
            with policy_calls():
                outcome = make_outcome(
                    ended.it,
                    ended.decision,
                    rids=result.rids,
                    context_tokens=result.context_tokens,
                    accepted=result.accept_lens,
                    verify_ms=result.verify_ms,
                    iteration_ms=result.iteration_ms,
                    early_exit=result.early_exit,
                    deepest_accepted=result.deepest_accepted,
                    after_prefill=result.after_prefill,
                    draft_kept=ended.plan.keep_warm,
                    stall_ms=result.stall_ms,
                    warm_up=ended.warm_up,
                    verify_as_decode=result.verify_as_decode,
                    draft_stale=ended.draft_stale,
                    note=ended.note,
                )
                try:
                    self.policy.observe(outcome)
                finally:  # the caller's bookkeeping of the requests stands if the policy raised
                    if result.on_taken is not None:
                        result.on_taken(outcome)
            taken.append(outcome)
        if taken and self._forget:
            self._forget_now()
        return taken

    def forget(self, rid: str) -> None:
        """A finished request's state leaves the policy once no waiting outcome holds it."""
        self._forget.add(rid)
        self._forget_now()

    def _forget_now(self) -> None:
        held = {rid for ended in self._waiting for rid in ended.result.rids}
        for rid in self._forget - held:
            self.policy.forget(rid)
        self._forget &= held
