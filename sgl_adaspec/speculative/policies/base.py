"""What every speculation policy is to the SGLang adapter (`sgl_adaspec/adapters/speculative/`).

One speculative iteration, as the adapter drives it:
1. SGLang's EAGLE draft builds each request's candidate tree (`Candidates`) by a beam search
   of the depth and width `policy.draft_shape` asks for (at most `--speculative-num-steps`
   and `--speculative-eagle-topk`; see `draft_tiers`);
2. `policy.decide(IterationInput)` -> `Decision`: which candidates each request verifies
   (a `Selection`, closed under parent) and the shape it followed, for the metrics;
3. the target verifies the selected nodes; the adapter reports back once, `observe(Outcome)`.
   The server's adapter and the simulator both build it with `make_outcome`, so a policy
   learns the same way in both;
4. a finished request is `forget`-ed so per-request state never outlives it.

An iteration may run without speculation (`draft_shape` returned depth 0): the policy is then
not asked to decide, and the outcome says so (draft_depth 0, every request verified 1 token).

Policies are pure (tensors and dataclasses, no SGLang) and keep their own state across
iterations; `PolicyBase` holds what all share: the feedback sequence and the driver's questions
here, the smoothed latencies, baseline TPOT, statistics and fitted latency models in
`policies/measurements.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from sgl_adaspec.scheduler.slo import SloBatch
from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.early_exit import EarlyExitPlan
from sgl_adaspec.speculative.host_copy import to_host
from sgl_adaspec.speculative.policies.measurements import PolicyMeasurements
from sgl_adaspec.speculative.selection import Selection


@dataclass(frozen=True)
class IterationInput:
    """What a policy sees of one iteration (B running requests, N candidates each).
    - cands: the draft's candidate trees;
    - slo: the requests' SLO state (TPOT SLO, decode time and tokens so far);
    - rids: the requests' ids, [B] strings, stable across iterations (per-request state key);
    - context_tokens: tokens the batch holds in the KV cache (prompts + outputs), counted by
      the caller on the host;
    - draft_depth / draft_width: the depth and width the draft ran this iteration (the
      policy's `draft_shape`, or SGLang's --speculative-num-steps / --speculative-eagle-topk
      where draft tiers do not run);
    - history: each request's tokens so far (prompt + output), only for policies that set
      `needs_history` (building it costs a copy per request per iteration); else None."""

    cands: Candidates
    slo: SloBatch
    rids: tuple[str, ...]
    context_tokens: int
    draft_depth: int
    draft_width: int
    history: tuple[list[int], ...] | None = None

    def __post_init__(self) -> None:
        bsz = self.cands.num_requests
        if len(self.rids) != bsz:
            raise ValueError(f"IterationInput: {bsz} requests but {len(self.rids)} rids")
        if not isinstance(self.context_tokens, int) or self.context_tokens < 0:
            raise ValueError(
                f"IterationInput: context_tokens must be an int >= 0, got {self.context_tokens!r}"
            )
        if self.slo.tpot_slo_ms.shape != (bsz,):
            raise ValueError(
                f"IterationInput: slo is for {self.slo.tpot_slo_ms.shape[0]} requests, not {bsz}"
            )

    def to_host(self) -> IterationInput:
        """The same input on its way to the host (`host_copy`)."""
        return replace(self, cands=self.cands.to_host())


@dataclass(frozen=True)
class Decision:
    """A policy's answer for one iteration.
    - selection: the candidate nodes each request verifies (roots implicit);
    - depth / width: the tree shape the policy used (deepest level allowed, beam width), and
      budget: the verified-token cap it applied (roots included) -- all for the metrics;
    - infeasible [B] bool: requests whose SLO the policy found unreachable and serves best
      effort (counted in the statistics);
    - early_exit: the verify pass's token-wise early exit (`early_exit`), or None;
    - calibrated_f [B, N] float64: the calibrated f' of the candidates, where the policy
      computed them anyway (None: `observe` calibrates the verified nodes); their sum over the
      selection is what the calibration expects it to accept, summed after the verify.
    budget and calibrated_f may be tensors on the draft's device, computed there between the
    draft and the verify; `make_outcome` reads them after the verify."""

    selection: Selection
    depth: int
    width: int
    budget: int | torch.Tensor
    infeasible: torch.Tensor
    early_exit: EarlyExitPlan | None = None
    calibrated_f: torch.Tensor | None = None

    def to_host(self) -> Decision:
        """The same decision on its way to the host (`host_copy`)."""

        def host(value):
            return to_host(value) if isinstance(value, torch.Tensor) else value

        return replace(
            self, selection=self.selection.to_host(), budget=host(self.budget),
            infeasible=host(self.infeasible), calibrated_f=host(self.calibrated_f),
        )  # fmt: skip


@dataclass(frozen=True)
class Outcome:
    """What one iteration returned (B running requests), reported once to `PolicyBase.observe`.
    - rids [B]; verified [B] int64: tokens each request verified, root included;
    - accepted [B] int64: tokens each request committed, bonus included (SGLang's accept
      length), or None when the verify pass reported none;
    - verified_f [B, N] float64: the draft's raw path probability f of each verified node, 0
      for the others (the calibration's input); None without speculation;
    - accepted_nodes [B, N] bool: the candidate nodes on each request's accepted path, or None
      when the verify pass did not say which they were;
    - verify_ms: the verify pass; iteration_ms: the whole iteration (in the server from the end
      of the previous decode iteration: the scheduler's work between them, the draft, the verify
      pass, the draft extend);
    - context_tokens: KV tokens of the batch (sum of context lengths);
    - draft_depth / draft_width: the draft shape that ran (0 steps: no speculation);
    - budget / depth / width: what the decision applied, for the statistics;
    - early_exit: (tested, exited, test_ms) of the verify pass's early exit, or None;
    - after_prefill: the iteration came right after a prefill (or was the first): its time
      includes the switch from extend to decode, not a steady price;
    - draft_kept: a plain iteration kept the draft's state (its extend ran: `keep_draft_warm`);
      one that did not leaves the next draft stale;
    - stall_ms: wall time since the previous decode iteration that requests of both spent
      waiting on other forwards (prefills): part of their TPOT no decode iteration shows;
    - verify_as_decode: the verify pass ran as a plain decode's forward (the CPU attention's
      unmasked one-node path, `adapters/platform/cpu/attention.py`), a path no tree verify takes;
    - predicted_accepted: the calibration's expected accepted draft tokens of what was
      verified, where the decision computed it (`Decision.predicted_accepted`), else None;
    - warm_up: the server's first speculative iteration. Its time may include one-off set-up
      (first draft forwards, first calls of the tree and selection ops), so it prices nothing:
      it would be one of the two draft-cost points the first plan rests on;
    - draft_stale: its draft ran on a stale state (`draft_is_stale` when it was decided);
    - note: what the policy kept of this iteration when it launched (`iteration_launched`);
      draft_stale and note None: observed as it ended, so the policy's own state says.
    Made by `make_outcome`."""

    rids: tuple[str, ...]
    verified: torch.Tensor
    accepted: torch.Tensor | None
    verified_f: torch.Tensor | None
    accepted_nodes: torch.Tensor | None
    verify_ms: float
    iteration_ms: float
    context_tokens: int
    draft_depth: int
    draft_width: int
    budget: int
    depth: int
    width: int
    early_exit: tuple[int, int, float] | None = None
    after_prefill: bool = False
    draft_kept: bool = True
    stall_ms: float = 0.0
    warm_up: bool = False
    verify_as_decode: bool = False
    predicted_accepted: float | None = None
    draft_stale: bool | None = None
    note: object = None

    @property
    def speculated(self) -> bool:
        return self.draft_depth > 0


def make_outcome(
    it: IterationInput | None,
    decision: Decision | None,
    *,
    rids: tuple[str, ...],
    context_tokens: int,
    accepted: torch.Tensor | None,
    verify_ms: float,
    iteration_ms: float,
    early_exit: tuple[int, int, float] | None = None,
    deepest_accepted: torch.Tensor | None = None,
    after_prefill: bool = False,
    draft_kept: bool = False,
    stall_ms: float = 0.0,
    warm_up: bool = False,
    verify_as_decode: bool = False,
    draft_stale: bool | None = None,
    note: object = None,
) -> Outcome:
    """The outcome of an iteration that ran `decision` on `it` (both None: no speculation;
    `draft_kept`: that plain iteration kept the draft's state; `warm_up`: this speculative
    one was the server's first). deepest_accepted [B] int64: each request's deepest accepted
    candidate node (-1: none), or None when unknown."""
    if decision is None or it is None:
        ones = torch.ones(len(rids), dtype=torch.long)
        return Outcome(
            rids, ones, accepted, None, None, verify_ms, iteration_ms, context_tokens, 0, 0,
            len(rids), 0, 0, after_prefill=after_prefill, draft_kept=draft_kept,
            stall_ms=stall_ms, verify_as_decode=verify_as_decode, note=note,
        )  # fmt: skip
    selection = decision.selection
    f = torch.where(selection.mask, it.cands.path_prob.to(selection.mask.device), 0.0)
    predicted = decision.calibrated_f
    if predicted is not None:
        predicted = (predicted * selection.mask).sum()
    return Outcome(
        rids=rids,
        verified=(selection.counts + 1).cpu().long(),
        accepted=None if accepted is None else accepted.detach().cpu().long(),
        verified_f=f.double().cpu(),
        accepted_nodes=(
            None if deepest_accepted is None else it.cands.path_mask(deepest_accepted).cpu()
        ),
        verify_ms=verify_ms,
        iteration_ms=iteration_ms,
        context_tokens=context_tokens,
        draft_depth=it.draft_depth,
        draft_width=it.draft_width,
        budget=int(decision.budget),
        depth=decision.depth,
        width=decision.width,
        early_exit=early_exit,
        after_prefill=after_prefill,
        stall_ms=stall_ms,
        warm_up=warm_up,
        verify_as_decode=verify_as_decode,
        predicted_accepted=None if predicted is None else float(predicted),
        draft_stale=draft_stale,
        note=note,
    )


@dataclass(kw_only=True)
class PolicyBase(PolicyMeasurements):
    """What the driver calls, on the measured state all policies share (`PolicyMeasurements`).
    Subclasses implement `decide` and may extend the `observe_*` methods (calling super) and
    `forget`."""

    # Whether the verify fit takes verify passes that ran as a plain decode's forward
    # (`Outcome.verify_as_decode`). A policy that prices its no-speculation choice with the
    # verify fit needs them; one that prices it with `plain_latency` (adaserve) does not.
    verify_fit_takes_decodes: ClassVar[bool] = True
    # Whether `decide` reads IterationInput.history (see there).
    needs_history = False

    def __post_init__(self) -> None:
        check_common_config(self.latency_smoothing, self.baseline_tpot_ms_config)

    def decide(self, it: IterationInput) -> Decision:
        raise NotImplementedError

    def observe(self, outcome: Outcome) -> None:
        """The one feedback entry of an iteration: latencies, then what each request committed,
        then the statistics. Subclasses extend the pieces below, not this sequence."""
        verified_tokens = int(outcome.verified.sum())
        self.observe_wall_time(outcome.iteration_ms, outcome.stall_ms)
        priced = not outcome.warm_up
        fitted = self.verify_fit_takes_decodes or not outcome.verify_as_decode
        self.observe_verify(
            outcome.verify_ms, verified_tokens, outcome.context_tokens, priced=priced and fitted
        )
        if outcome.early_exit is not None:
            self.observe_early_exit(*outcome.early_exit)
        if outcome.accepted is not None:
            if outcome.speculated:
                self.observe_outcome(outcome.rids, outcome.verified, outcome.accepted)
            stale = outcome.draft_stale
            if outcome.verified_f is not None and not (
                self.draft_is_stale() if stale is None else stale
            ):
                # The calibration's prediction before it learns from this outcome (the
                # decision's where it computed one: the same calibration, one call fewer).
                predicted = outcome.predicted_accepted
                if predicted is None:
                    predicted = self.acceptance.calibrated_sum(outcome.verified_f)
                self.stats.observe_calibration(
                    float(outcome.verified_f.sum()),
                    predicted,
                    float(outcome.accepted.sum()) - len(outcome.rids),
                )
                if outcome.accepted_nodes is not None:
                    self.acceptance.observe(outcome.verified_f, outcome.accepted_nodes)
                    self.stats.calibration_trials += int((outcome.verified_f > 0).sum())
            if outcome.speculated:  # plain iterations are counted apart (observe_plain)
                self.stats.observe_iteration(
                    outcome.verified.tolist(), outcome.accepted.tolist(), outcome.budget,
                    outcome.depth, outcome.width,
                )  # fmt: skip
        if outcome.speculated:
            self.stats.observe_speculative_ms(outcome.iteration_ms)
            self.observe_iteration(
                outcome.iteration_ms, outcome.draft_depth, len(outcome.rids), outcome.draft_width,
                priced=priced,
            )  # fmt: skip
        else:
            self.observe_plain_iteration(
                outcome.iteration_ms, len(outcome.rids), outcome.context_tokens,
                self.steady_plain(outcome),
            )  # fmt: skip
        self._previous_plain = 0 if outcome.speculated else len(outcome.rids)
        # The fits the next decision reads, made now, after the verify (under SGLang's overlap
        # scheduler beside the device's work), not between the next draft and its verify.
        self.verify_latency.coefficients()
        self.acceptance.fit()

    def account(self) -> dict:
        """Why the last iteration ran as it did, as JSON values, for the decision log
        (`speculative.decision_log`); read only: asking changes no fit and no decision."""
        return {
            "t_spec_ms": None if self.t_spec_ms is None else round(self.t_spec_ms, 3),
            "wall_per_decode": round(self.wall_per_decode, 3),
            "wall_spread": round(self.wall_spread, 3),
            "fits": {
                "verify": self.verify_latency.last_fit(),
                "draft": self.draft_latency.last_fit(),
                "plain": self.plain_latency.last_fit(),
            },
        }

    def draft_is_stale(self) -> bool:
        """Whether this iteration's draft ran on stale state (after iterations without
        speculation, whose draft extends SGLang skipped): its path probabilities then say
        little of acceptance, and its outcome trains no calibration."""
        return False

    def iteration_launched(self, warm: bool) -> object:
        """Once per iteration, when its draft is settled (after `decide`, or after the plan of
        a plain iteration; `warm`: the draft ran or kept its state): what `observe` needs back
        of this iteration (`Outcome.note`), since with a lagged observe later iterations are
        planned before it comes. Default: nothing."""
        return None

    def keep_draft_warm(self) -> bool:
        """Asked after `draft_shape` chose depth 0: whether this plain iteration keeps the
        draft's state (SGLang's draft extend runs, as in SGLang's own adaptive steps 0), so a
        later draft starts from it. Default: no (the extend is skipped, the draft goes stale)."""
        return False

    def draft_prefills(self, new_requests: int) -> bool:
        """Asked at each prefill of `new_requests` new requests: whether the draft prefills
        them too (SGLang's draft extend after the target's prefill). A request prefilled
        without it is blind to the draft for its life (the draft never saw its prompt): its
        candidates' path probabilities read 0, so nothing of its tree is verified. Default:
        yes."""
        return True

    def draft_shape(
        self, num_requests: int, steps: int, topk: int, slo: SloBatch | None = None
    ) -> tuple[int, int]:
        """(depth, width) of the draft's beam search this iteration, asked before the draft
        runs, within the configured (steps, topk); `slo`: the running requests' SLO state.
        Default: the configured search."""
        return steps, topk

    def draft_runs(self, depth: int, width: int) -> None:
        """Told before the draft when it runs (depth, width) rather than the shape
        `draft_shape` asked for (a server's draft tier covering it, or the configured search):
        what the policy readies for the draft's candidates before the draft, it readies for
        this shape, so that none of it runs between the draft and the verify. Default:
        nothing."""

    def draft_widths(self, topk: int) -> list[int] | None:
        """The beam widths `draft_shape` may ask for with `--speculative-eagle-topk` topk: the
        server builds draft tiers at these (`draft_tiers.tier_shapes`). None: any width."""
        return [topk]

    def observe_outcome(
        self, rids: tuple[str, ...], verified: torch.Tensor, accepted: torch.Tensor
    ) -> None:
        """verified [B]: tokens each request verified, root included; accepted [B]: tokens it
        committed, the bonus token included (SGLang's accept length)."""

    def observe_early_exit(self, tested: int, exited: int, test_ms: float) -> None:
        """A verify pass ran the early-exit test (`early_exit`) on `tested` draft tokens, in
        `test_ms`, and `exited` of them left the pass."""
        self.stats.observe_early_exit(tested, exited, test_ms)

    def forget(self, rid: str) -> None:
        """Drop per-request state of a finished request."""


def policy_calls():
    """The context every driver (the SGLang hooks, the simulator's adapter) makes a policy's
    calls in, and builds their inputs (`SloBatch`) and outcomes in: torch's inference mode. A
    policy records nothing for autograd, and on its many small tensors the bookkeeping this
    mode skips is a tenth of adaserve's time. What a policy keeps across calls is then an
    inference tensor, which nothing may update in place outside this context: policies keep
    state by replacing tensors, never by writing into one."""
    return torch.inference_mode()


def check_common_config(latency_smoothing: float, baseline_tpot_ms: float | None) -> None:
    """Validation every policy config shares (raises ValueError naming the field)."""
    if not 0 < latency_smoothing <= 1:
        raise ValueError(f"latency_smoothing must be in (0, 1], got {latency_smoothing}")
    if baseline_tpot_ms is not None and not baseline_tpot_ms > 0:
        raise ValueError(f"baseline_tpot_ms must be > 0, got {baseline_tpot_ms}")


def no_infeasible(it: IterationInput) -> torch.Tensor:
    return torch.zeros(it.cands.num_requests, dtype=torch.bool)
