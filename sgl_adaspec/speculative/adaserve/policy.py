"""The adaserve policy: per iteration, the draft's shape and which candidate nodes to verify.

Two budget rules (`AdaserveConfig.budget_rule`):
- "cost" (default): before the draft, the mode machine (`modes.next_draft`) picks the shape,
  mostly the plan's (`planner.plan_shape` on the measured models, `pricing.py`; depth 0: no
  speculation), and with the plan's shape its nodes per request: B = n x k is known before the
  draft. A draft no plan shaped (a probe, an exploration) gets B after it, where expected
  committed tokens per ms peak (`planner.cost_budget`). AdaServe's SLO-customized phase spends
  B most urgent request first, at most ~1.2 B / n nodes each.
- "knee": the paper's rules, kept for comparison: B at the knee of the start-up verify
  profile (or --adaserve-budget), (d, w) from eq. 8-9 (`knee_shape`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from sgl_adaspec.scheduler.slo import SloBatch, lead_weight, required_tokens
from sgl_adaspec.speculative.adaserve.gain_table import slo_group_keys
from sgl_adaspec.speculative.adaserve.knee_shape import tree_shape
from sgl_adaspec.speculative.adaserve.modes import DraftState, Mode, next_draft
from sgl_adaspec.speculative.adaserve.planner import PlanChoice, SpendCurve, cost_budget
from sgl_adaspec.speculative.adaserve.pricing import AdaservePricing
from sgl_adaspec.speculative.adaserve.track_record import load_bucket
from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.host_copy import to_device, to_dtype
from sgl_adaspec.speculative.policies.base import Decision, IterationInput, Outcome
from sgl_adaspec.speculative.selection import (
    Demand, Selection, select_for_demand, select_within,
)
from sgl_adaspec.speculative.shapes import restrict_to_shape

# The gain table reads one planned draft in this many (and every other draft): reading each
# was adaserve's largest per-iteration cost.
READ_PLANNED_EVERY = 4


@dataclass(frozen=True)
class Plan:
    """One iteration's tree shape (d, w) and token budget B."""

    depth: int
    width: int
    budget: int


@dataclass
class AdaservePolicy(AdaservePricing):
    """Each iteration's draft shape and selection, on what its plans are priced from
    (`AdaservePricing`)."""

    _last_load: int = field(default=0, repr=False)
    _blind_prefills: int = field(default=0, repr=False)
    # The plan this iteration runs; None where no plan predicted it (plain, probe, explore, cold).
    _running_plan: PlanChoice | None = field(default=None, repr=False)
    _last_planned: PlanChoice | None = field(default=None, repr=False)
    _blind_running: int = field(default=0, repr=False)
    _planned_drafts: int = field(default=0, repr=False)
    # The gain table's reading of this iteration's draft, left for `observe`, after the verify.
    _unread_draft: tuple | None = field(default=None, repr=False)
    # The SLO terms of the draft planned last (`_SloTerms`), and what `select` last found
    # beyond reach.
    _slo_terms: _SloTerms | None = field(default=None, repr=False)
    _selected_infeasible: torch.Tensor | None = field(default=None, repr=False)

    def draft_widths(self, topk: int) -> list[int] | None:
        return None  # eq. 9 and the cost rule's shape grid ask for any width

    def draft_shape(
        self, num_requests: int, steps: int, topk: int, slo: SloBatch | None = None
    ) -> tuple[int, int]:
        """Within (steps, topk): eq. 8-9's shape under the knee rule, the mode machine's under
        the cost rule."""
        if self.config.budget_rule == "knee":
            self.draft_state = replace(self.draft_state, mode=Mode.KNEE)
            depth, width = tree_shape(num_requests, self.config.tree)
            return min(depth, steps), min(width, topk)
        self._deciding_for = num_requests
        draft = next_draft(
            self.draft_state,
            _Questions(self, slo, num_requests, (steps, topk)),
            full=(steps, topk),
            measured=self.plain_price.measured_at(self.plain_latency, num_requests),
            has_slo=slo is not None,
            probe_interval=self.config.probe_interval,
            explore_interval=self.config.explore_interval,
        )
        self.draft_state, planned, mode = draft.state, draft.plan, draft.state.mode
        self._last_planned = planned
        self._running_plan = planned if mode is Mode.PLANNED else None
        if mode.speculates:
            reasons = self.stats.speculation_reasons
            reasons[mode.reason] = reasons.get(mode.reason, 0) + 1
        if planned is not None and mode is not Mode.MEASURE_PLAIN:
            self._report(planned, num_requests, None if mode is Mode.STAND_DOWN else draft.shape)
        self._slo_terms = None
        if mode.speculates and slo is not None:  # now, beside the device's work
            self._slo_terms = self._terms_for(slo, *draft.shape)
        return draft.shape

    def draft_runs(self, depth: int, width: int) -> None:
        """The selection's terms for the shape the draft runs (a tier covering the plan's, or
        the configured search), made before the draft as the plan's own are."""
        terms = self._slo_terms
        if terms is not None and terms.shape != (depth, width):
            self._slo_terms = self._terms_for(terms.slo, depth, width)

    def _terms_for(self, slo: SloBatch, depth: int, width: int) -> _SloTerms:
        """The selection's terms for a draft of (depth, width) of this batch; the running plan's
        budget where that plan chose the shape."""
        pace = self.wall_per_decode  # A(r) for the wall time until the next iteration
        required = required_tokens(slo, (self.t_spec_ms or 0.0) * pace)
        infeasible = self._infeasible(slo, depth)
        n = slo.num_requests
        # Verifies of n roots and up to d x w nodes of each request: the beam's count, which
        # the plan prices (a server's tree may hold more; a fitted budget buys no more).
        nodes = torch.arange(n * depth * width + 1)
        verify = self.verify_latency.tokens_curve(n + nodes.double())
        demand = Demand.of(
            torch.where(infeasible, 0.0, required), self._rank_weight(slo), drop_beyond_reach=True
        )
        return _SloTerms(
            slo, (depth, width), demand, infeasible,
            None if verify is None else SpendCurve.of(self._draft_ms(depth, width, n), verify),
            _max_nodes(nodes, n), self._planned_nodes(n, depth, width),
        )  # fmt: skip

    def _planned_nodes(self, num_requests: int, depth: int, width: int) -> int | None:
        """The candidate nodes the running plan verifies beside the roots (its n x k, within
        --adaserve-budget), where the draft ran that plan's shape or one covering it (a server's
        draft tier); else None."""
        plan = self._running_plan
        if plan is None or plan.nodes_per_request < 1:
            return None
        if plan.depth > depth or plan.width > width:
            return None
        nodes = num_requests * plan.nodes_per_request
        cap = self.config.budget
        return nodes if cap is None else min(nodes, max(cap - num_requests, 0))

    def draft_is_stale(self) -> bool:
        return self.draft_state.cold

    def keep_draft_warm(self) -> bool:
        """Where speculation pays for one request alone (the load a batch can shrink back to),
        unless a long stand-down's extends cost more than the cold start they spare."""
        return self.config.budget_rule == "knee" or (
            self._speculation_pays_alone() and self._warm_pays_until_the_next_draft()
        )

    def draft_prefills(self, new_requests: int) -> bool:
        """Skipped only after a long time without planned speculation where speculation pays at
        no load the server has run or these requests bring: a request prefilled without the
        draft is blind to it for life. One prefill in `probe_interval` still runs it, so that
        probes have requests to measure."""
        if (
            self.config.budget_rule == "knee"
            or not self.draft_state.long_without_plan(self.config.probe_interval)
            or self._speculation_pays_somewhere(self._last_load + new_requests)
        ):
            return True
        self._blind_prefills += 1
        return self._blind_prefills % self.config.probe_interval == 0

    def iteration_launched(self, warm: bool) -> _Launched:
        """The draft state moves on now (a plain iteration that did not keep the draft leaves
        the next draft stale); the rest of this iteration waits for its outcome."""
        unread = self._unread_draft
        if unread is not None:  # read after the iteration's buffers may be reused
            unread = (unread[0].to_host(), *unread[1:])
        note = _Launched(self.draft_state, self._running_plan, self._last_planned, unread)
        self._running_plan = self._unread_draft = None
        self.draft_state = self.draft_state.observed(warm)
        return note

    def observe(self, outcome: Outcome) -> None:
        note = outcome.note
        if note is None:  # observed as it ended, with no iteration launched in between
            note = self.iteration_launched(outcome.speculated or outcome.draft_kept)
        if note.unread_draft is not None:  # the gain table reads the draft, on the host now
            shaped, depth, width, tpot_slo_ms, rank_weight = note.unread_draft
            self.gain.observe(shaped, depth, width, slo_group_keys(tpot_slo_ms), rank_weight)
        self._last_load = len(outcome.rids)
        self._max_load = max(self._max_load, self._last_load)
        if not outcome.speculated:
            self.plain_price.observe_plain(outcome.draft_kept)
        planned = note.running_plan
        if self.steady_plain(outcome) and outcome.iteration_ms > 0:
            self.plain_price.observe_steady(
                self._last_load, outcome.context_tokens, outcome.iteration_ms
            )
        state = note.state
        if state.mode is Mode.PROBE and not state.cold and self._measured(outcome):
            self._judge_probe(outcome, note.last_planned)
        if outcome.speculated:  # what a draft returned may end a stand-down now
            self.plan_reuse.standing_down = None
            if not outcome.warm_up:
                self._draft_loads[load_bucket(self._last_load)] = self._last_load
        if planned is not None and self._measured(outcome):
            self.record_at(len(outcome.rids)).observe(
                planned.expected_accepted * len(outcome.rids),
                planned.iteration_ms,
                float(outcome.accepted.sum()),
                outcome.iteration_ms,
            )
        super().observe(outcome)

    @staticmethod
    def _measured(outcome: Outcome) -> bool:
        """A speculative outcome in a steady iteration's time."""
        return (
            outcome.speculated
            and outcome.accepted is not None
            and not outcome.after_prefill
            and outcome.iteration_ms > 0  # a clock that did not move prices nothing
        )

    def _judge_probe(self, outcome: Outcome, stand_down: PlanChoice | None) -> None:
        """A probe that beat the stand-down's plain price by the switch margin clears the
        track record at this load: the record moves only while plans speculate, so one formed
        under a bad fit would hold a stand-down for good."""
        if stand_down is None or stand_down.depth > 0 or stand_down.plain_ms <= 0:
            return
        n = len(outcome.rids)
        realized = float(outcome.accepted.sum()) / outcome.iteration_ms
        if realized > (1.0 + self.config.switch_margin) * n / stand_down.plain_ms:
            self.records.pop(load_bucket(n), None)
            self.stats.probes_that_paid += 1

    def account(self) -> dict:
        planned = self._last_planned
        return {
            **super().account(),
            "reason": self.draft_state.reason,
            "plan": None if planned is None else planned.as_dict(),
            "blind_requests": self._blind_running,
            "track_record": {str(b): round(r.ratio, 3) for b, r in sorted(self.records.items())},
            "probe_every": self.draft_state.probe_every,
        }

    def plan(self, cands: Candidates) -> Plan:
        """The knee rule's plan: eq. 8-9's shape, B the configured one or every node."""
        depth, width = tree_shape(cands.num_requests, self.config.tree)
        return Plan(depth, width, self._budget_cap(cands))

    def _budget_cap(self, cands: Candidates) -> int:
        """--adaserve-budget, or every candidate node and root."""
        budget = self.config.budget
        return cands.num_requests * (cands.num_nodes + 1) if budget is None else budget

    def select(
        self,
        cands: Candidates,
        slo: SloBatch,
        draft_depth: int | None = None,
        context_tokens: int = 0,
        draft_width: int | None = None,
    ) -> tuple[Selection, torch.Tensor, Plan, torch.Tensor | None]:
        """The selection, A(r) [B] it was computed for (0: served best effort, as are, under
        the cost rule, the requests whose whole tree cannot bring them back:
        `Demand.drop_beyond_reach`), the plan it followed, and the calibrated f' [B, N] float64
        it selected by (None under the knee rule)."""
        if self.config.budget_rule != "cost":  # A(r) for one iteration, as the paper
            plan = self.plan(cands)
            shaped = restrict_to_shape(cands, plan.depth, plan.width)
            infeasible = self._infeasible(slo, plan.depth)
            required = torch.where(infeasible, 0.0, required_tokens(slo, self.t_spec_ms or 0.0))
            n_max = self.config.max_nodes_per_request
            n_max = cands.num_nodes if n_max is None else n_max
            selection = select_for_demand(shaped, Demand.of(required), plan.budget, n_max)
            self._selected_infeasible = infeasible
            return selection, required, plan, None
        # The draft already ran at its own shape: select within all it drafted. SGLang's tree
        # also holds leaves its beam did not keep; narrowing them off would run a beam search
        # between the draft and the verify (the gain table prices the drafted width so too).
        depth = draft_depth if draft_depth is not None else int(cands.max_depth.max())
        width = draft_width or tree_shape(cands.num_requests, self.config.tree)[1]
        shaped = cands if draft_width else restrict_to_shape(cands, depth, width)
        terms = self._slo_terms
        if terms is None or terms.slo is not slo or terms.shape != (depth, width):
            terms = self._terms_for(slo, depth, width)  # not planned for this draft
        # float64 for the budget and the outcome's prediction, the draft's dtype for the
        # selection.
        exact = self.acceptance.apply_exact(shaped.path_prob)
        calibrated = to_dtype(exact, shaped.path_prob.dtype)
        self._keep_draft_for_the_gain_table(shaped, depth, width, slo, terms.demand.rank_weight)
        n, n_max, cap = cands.num_requests, self.config.max_nodes_per_request, self.config.budget
        planned = terms.planned_nodes
        # Else the verify model prices this draft's own nodes: the cost rule's budget.
        fitted = planned is None and terms.spend is not None
        if planned is not None:  # known before the draft: no work between it and the verify
            draft_budget, budget = planned, planned + n
            if n_max is None:
                n_max = _max_nodes(planned, n)
        elif fitted:
            draft_budget = cost_budget(exact, shaped.valid, terms.spend.at(context_tokens))
            if cap is not None:
                draft_budget = draft_budget.clamp(max=max(cap - n, 0))
            if n_max is None and terms.demand.asks_past_the_bonus:  # else the SLO phase is idle
                n_max = torch.take(
                    to_device(terms.max_nodes_by_spare, draft_budget.device), draft_budget
                )
            budget = draft_budget + n
        else:
            budget = self._budget_cap(cands)
            draft_budget = max(budget - n, 0)
            if n_max is None:
                n_max = _max_nodes(draft_budget, n)
        shaped = shaped.derived(path_prob=calibrated)  # monotone: no cap needed
        # n_max unread (0) where the SLO phase is idle. No node f' expects nothing of is
        # verified: the cost rule's budget buys none, the plan's is told not to.
        selection = select_within(
            shaped, terms.demand, draft_budget, 0 if n_max is None else n_max,
            None if fitted else 0.0,
        )  # fmt: skip
        self._selected_infeasible = terms.infeasible
        return selection, terms.demand.required, Plan(depth, width, budget), exact

    def _keep_draft_for_the_gain_table(
        self,
        shaped: Candidates,
        depth: int,
        width: int,
        slo: SloBatch,
        rank_weight: torch.Tensor | None,
    ) -> None:
        """The gain table reads every draft off the plan and one planned draft in
        READ_PLANNED_EVERY, after the verify: before it, the read would wait on the device."""
        on_plan = self.draft_state.mode is Mode.PLANNED
        if on_plan:
            self._planned_drafts += 1
        if not self.draft_state.cold and (
            not on_plan or self._planned_drafts % READ_PLANNED_EVERY == 0
        ):
            self._unread_draft = (shaped, depth, width, slo.tpot_slo_ms, rank_weight)

    def decide(self, it: IterationInput) -> Decision:
        context = it.context_tokens
        self._context_tokens = context
        self._context_per_request = context // max(it.cands.num_requests, 1)
        selection, _required, plan, calibrated = self.select(
            it.cands, it.slo, it.draft_depth, context, it.draft_width
        )
        return Decision(
            selection, plan.depth, plan.width, plan.budget, self._selected_infeasible,
            calibrated_f=calibrated,
        )  # fmt: skip

    def _rank_weight(self, slo: SloBatch) -> torch.Tensor | None:
        """[B] what the throughput phase ranks nodes by besides f' (None: f' alone); the gain
        table pools by it too, so the plan expects what the selection verifies."""
        if self.config.lead_floor >= 1.0:
            return None
        return lead_weight(slo, self.config.lead_scale, self.config.lead_floor)

    def _infeasible(self, slo: SloBatch, depth: int) -> torch.Tensor:
        """[B] bool: requests whose SLO no depth-d tree could meet even alone, served best
        effort so they do not take the budget from those it can help (AdaServe 4.3)."""
        if self.t_spec_ms is None:
            return torch.zeros_like(slo.has_slo)
        best_tpot_ms = self.t_spec_ms / (depth + 1)
        return slo.has_slo & (slo.tpot_slo_ms < best_tpot_ms)


def _max_nodes(spare, num_requests: int):
    """The SLO phase's n_max with `spare` (int or int64 tensor) candidate nodes to verify, as
    AdaServe's public code: ceil(1.2 * spare / n), in integer arithmetic (exactly), so that a
    request whose tree cannot reach A(r) does not drain the budget."""
    return (6 * spare + (5 * num_requests - 1)) // (5 * num_requests)


@dataclass(frozen=True)
class _SloTerms:
    """What the selection takes of the SLO state for a draft of `shape`, computed when the draft
    is planned (beside the device's work) rather than between the draft and its verify:
    the selection's demand (A(r), 0 for the requests beyond any tree, its order and the
    throughput phase's rank weight, None: f' alone), those requests [B] bool, the iteration's
    predicted ms (the draft's sunk ms and the verify's) with m = 0.. candidate nodes but for
    the context's term (None while the verify model is unfitted), the SLO phase's n_max
    [m + 1] int64 when m candidate nodes are verified (`_max_nodes`), and the candidate nodes
    the running plan verifies (None: no plan chose this shape)."""

    slo: SloBatch
    shape: tuple[int, int]
    demand: Demand
    infeasible: torch.Tensor
    spend: SpendCurve | None
    max_nodes_by_spare: torch.Tensor
    planned_nodes: int | None


@dataclass(frozen=True)
class _Launched:
    """What `observe` needs of the iteration it observes (`PolicyBase.iteration_launched`):
    the draft state it ran in, the plan it ran (None where none predicted it), the plan last
    asked for (a probe's stand-down), and the gain table's unread draft."""

    state: DraftState
    running_plan: PlanChoice | None
    last_planned: PlanChoice | None
    unread_draft: tuple | None


@dataclass
class _Questions:
    """What `modes.next_draft` asks of the policy while it decides one draft."""

    policy: AdaservePolicy
    slo: SloBatch | None
    num_requests: int
    full: tuple[int, int]

    def plan(self) -> PlanChoice | None:
        policy, slo = self.policy, self.slo
        planned = None if slo is None else policy._cost_plan(slo)
        blind = None if slo is None else slo.draft_blind
        policy._blind_running = 0 if blind is None else int(blind.sum())
        return planned

    def speculates_against_plain_floor(self, planned: PlanChoice | None) -> bool:
        return self.policy._speculates_against_plain_floor(self.slo, planned)

    def readable(self) -> bool:
        return self.policy._blind_running < self.num_requests

    def can_afford_probe(self, planned: PlanChoice, stale: bool) -> bool:
        return self.policy._can_afford_probe(self.slo, planned, self.full, stale)

    def speculates_against_draft_floor(self) -> bool:
        return self.policy._speculates_against_draft_floor(self.slo)

    def explore_shape(self, planned: PlanChoice) -> tuple[int, int]:
        return self.policy._explore_shape(self.num_requests, self.full, planned)
