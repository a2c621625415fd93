"""One speculative iteration as the server and the simulator drive a policy through it: plan the
draft, decide on its candidates, observe the outcome once.

The SGLang hooks (`adapters/speculative/hooks.py`) and the simulator (`sim/policies.py`) call
these three and nothing else of the policy's iteration: they translate their own values to
`DraftPlan`, `IterationInput` and `VerifyResult`, and back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from sgl_adaspec.scheduler.slo import SloBatch
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
    """What an iteration returned, read on the host once it ended (B running requests).
    - accept_lens [B] int64: tokens each request committed, bonus included (SGLang's
      `accept_lens`; 1 each in a plain iteration), or None where the verify reported none;
    - verify_ms: the verify pass (the decode forward in a plain iteration); iteration_ms: the
      whole iteration;
    - deepest_accepted [B] int64: each request's deepest accepted candidate node (-1: none),
      None when unknown;
    - the rest as `Outcome`'s fields of the same names."""

    accept_lens: torch.Tensor | None
    verify_ms: float
    iteration_ms: float
    rids: tuple[str, ...]
    context_tokens: int
    deepest_accepted: torch.Tensor | None = None
    early_exit: tuple[int, int, float] | None = None
    after_prefill: bool = False
    stall_ms: float = 0.0
    verify_as_decode: bool = False


@dataclass
class IterationDriver:
    """Drives one policy through its iterations (`plan`, then `decide` if the plan drafts, then
    `observe`). It keeps what spans iterations on the caller's side of the policy: whether a
    decided iteration was observed yet (on a server the first is the warm-up, `Outcome.warm_up`:
    `first_draft_warms_up`) and the host time of the last decision (`critical_s`: what the
    verify waited on)."""

    policy: PolicyBase
    clock: Callable[[], float] = time.perf_counter
    # False in the simulator: its first speculative iteration pays no one-off set-up.
    first_draft_warms_up: bool = True
    critical_s: float = 0.0
    _decided_observed: bool = field(default=False, repr=False)

    def plan(
        self, num_requests: int, configured: tuple[int, int], slo: SloBatch | None
    ) -> DraftPlan:
        """The draft's shape within the configured search (steps, topk)."""
        self.critical_s = 0.0
        with policy_calls():
            depth, width = self.policy.draft_shape(num_requests, *configured, slo)
            keep_warm = depth == 0 and self.policy.keep_draft_warm()
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
    ) -> Outcome:
        """The iteration's one outcome, observed by the policy (`it` and `decision`: those of a
        decided draft; None for a plain iteration)."""
        if plan.plain:
            self.policy.stats.observe_plain(len(result.rids), plan.keep_warm)
        warm_up = decision is not None and not self._decided_observed
        self._decided_observed |= warm_up
        warm_up &= self.first_draft_warms_up
        with policy_calls():
            outcome = make_outcome(
                it,
                decision,
                rids=result.rids,
                context_tokens=result.context_tokens,
                accepted=result.accept_lens,
                verify_ms=result.verify_ms,
                iteration_ms=result.iteration_ms,
                early_exit=result.early_exit,
                deepest_accepted=result.deepest_accepted,
                after_prefill=result.after_prefill,
                draft_kept=plan.keep_warm,
                stall_ms=result.stall_ms,
                warm_up=warm_up,
                verify_as_decode=result.verify_as_decode,
            )
            self.policy.observe(outcome)
        return outcome
