"""The adaserve policy: per iteration, the draft's shape and which candidate nodes to verify.

Two budget rules (`AdaserveConfig.budget_rule`):
- "cost" (default): before the draft, the mode machine (`modes.next_draft`) picks the shape,
  mostly the plan's (`planner.plan_shape`, depth 0: no speculation); after it, B maximizes
  expected committed tokens per ms (`planner.cost_budget`), and AdaServe's SLO-customized
  phase spends it most urgent request first, at most ~1.2 B / n nodes each.
- "knee": the paper's rules, kept for comparison: B at the knee of the start-up verify
  profile (or --adaserve-budget), (d, w) from eq. 8-9 (`knee_shape`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, replace
from functools import partial
from typing import ClassVar

import torch

from sgl_adaspec.scheduler.slo import SloBatch, lead_weight, required_tokens
from sgl_adaspec.speculative.adaserve.config import AdaserveConfig
from sgl_adaspec.speculative.adaserve.gain_table import ShapeGain, slo_group_keys
from sgl_adaspec.speculative.adaserve.knee_shape import beam_width, tree_shape
from sgl_adaspec.speculative.adaserve.modes import DraftState, Mode, next_draft
from sgl_adaspec.speculative.adaserve.plain_price import PlainPrice
from sgl_adaspec.speculative.adaserve.plan_reuse import PlanReuse, batch_composition
from sgl_adaspec.speculative.adaserve.planner import (
    PlanChoice,
    cost_budget,
    plan_shape,
    speculation_pays,
)
from sgl_adaspec.speculative.adaserve.track_record import PlanTrackRecord, load_bucket
from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.policies.base import (
    Decision,
    IterationInput,
    Outcome,
    PolicyBase,
)
from sgl_adaspec.speculative.selection import Selection, expected_accepted, select_adaserve
from sgl_adaspec.speculative.shapes import draft_rows, restrict_to_shape

# Calibration outcomes between two recalibrations of the gain table's kept drafts:
# recalibrating at every plan was most of a plan's time.
GAIN_RECALIBRATION = 8
# The gain table reads one planned draft in this many (and every other draft): reading each
# was adaserve's largest per-iteration cost.
READ_PLANNED_EVERY = 4
# The most an exploring full search may cost beyond the planned draft, as a share of the
# planned iteration; past it the exploring draft is a chain.
EXPLORE_COST = 0.25
# Plain iterations measured before their cheapest bounds a plain decode's price: the first
# few, right after start-up, may all be stalled.
FLOOR_MEASUREMENTS = 4


@dataclass(frozen=True)
class Plan:
    """One iteration's tree shape (d, w) and token budget B."""

    depth: int
    width: int
    budget: int


@dataclass
class AdaservePolicy(PolicyBase):
    # Plans price a plain iteration with `plain_latency`; one-node verifies (the decode
    # attention on the CPU path) would underprice tree verifies.
    verify_fit_takes_decodes: ClassVar[bool] = False

    config: AdaserveConfig = field(default_factory=AdaserveConfig)
    gain: ShapeGain = field(default_factory=ShapeGain)
    _context_tokens: int = field(default=0, repr=False)
    _context_per_request: int = field(default=0, repr=False)
    draft_state: DraftState = field(init=False, repr=False)
    _pays_cache: dict = field(default_factory=dict, repr=False)  # loads -> (inputs, answer)
    _max_load: int = field(default=1, repr=False)
    _deciding_for: int = field(default=1, repr=False)  # requests of the draft being decided
    _last_load: int = field(default=0, repr=False)
    plain_price: PlainPrice = field(default_factory=PlainPrice)
    _draft_loads: dict = field(default_factory=dict, repr=False)  # bucket -> a priced load
    _blind_prefills: int = field(default=0, repr=False)
    plan_reuse: PlanReuse = field(default_factory=PlanReuse, repr=False)
    _refreshed_for: tuple | None = field(default=None, repr=False)  # gain version, calibration
    _reported: tuple = field(default=(None, None), repr=False)  # what stats.last_plan shows
    # Per `load_bucket`: the cost models' errors depend on the load.
    records: dict[int, PlanTrackRecord] = field(default_factory=dict)
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

    def __post_init__(self) -> None:
        self.latency_smoothing = self.config.latency_smoothing
        self.baseline_tpot_ms_config = self.config.baseline_tpot_ms
        self.draft_state = DraftState(probe_every=self.config.probe_interval)
        super().__post_init__()

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

    def _terms_for(self, slo: SloBatch, depth: int, width: int) -> _SloTerms:
        pace = self.wall_per_decode  # A(r) for the wall time until the next iteration
        required = required_tokens(slo, (self.t_spec_ms or 0.0) * pace)
        infeasible = self._infeasible(slo, depth)
        return _SloTerms(
            slo, (depth, width), self._rank_weight(slo), infeasible,
            torch.where(infeasible, 0.0, required),
            self._draft_ms(depth, width, slo.num_requests),
        )  # fmt: skip

    def _explore_shape(self, num_requests: int, full: tuple[int, int], planned) -> tuple[int, int]:
        """The full search no wider than the plan may choose at this load, or the full-depth
        chain where that costs too much: a wide draft's cost grows with the load, its gain
        hardly does."""
        full = (full[0], self._load_adaptive_width(num_requests, full[1]))
        full_ms = self._draft_ms(*full, num_requests)
        extra_ms = full_ms - self._draft_ms(planned.depth, planned.width, num_requests)
        return full if extra_ms <= EXPLORE_COST * planned.iteration_ms else (full[0], 1)

    def _draft_ms(self, depth: int, width: int, num_requests: int) -> float:
        rows = draft_rows(depth, width, num_requests)
        return self.draft_latency.predict((depth, rows)) or 0.0

    def _can_afford_probe(self, slo: SloBatch, planned, full: tuple[int, int], stale: bool) -> bool:
        """Whether every request on its SLO track has the slack a probe costs: the probe is
        the policy's investment, not theirs. A request already behind does not block it."""
        cost_ms = self._probe_cost_ms(slo.num_requests, planned, full, stale)
        slack = slo.slack_ms
        on_track = slack >= 0
        return not bool((slack[on_track] < cost_ms).any())

    def _probe_cost_ms(
        self, num_requests: int, planned, full: tuple[int, int], stale: bool
    ) -> float:
        """A probe's two iterations beyond two plain decodes, at the shapes it runs, with
        nothing credited for what they may accept."""
        cost_ms = 0.0
        for depth, width in ((1, 1) if stale else full, full):
            # A plan exists, so the verify model has its fit.
            verify_ms = self.verify_latency.predict(
                (num_requests * (1 + depth), self._context_tokens)
            )
            iteration_ms = verify_ms + self._draft_ms(depth, width, num_requests)
            cost_ms += max(iteration_ms - planned.plain_ms, 0.0)
        return cost_ms

    def draft_is_stale(self) -> bool:
        return self.draft_state.cold

    def keep_draft_warm(self) -> bool:
        """Where speculation pays for one request alone (the load a batch can shrink back to),
        unless a long stand-down's extends cost more than the cold start they spare."""
        return self.config.budget_rule == "knee" or (
            self._speculation_pays_alone() and self._warm_pays_until_the_next_draft()
        )

    def _warm_pays_until_the_next_draft(self) -> bool:
        """Outside a long stand-down, warm: the load that brings speculation back may come at
        any iteration. Within one, whether the extends until the next probe cost less than the
        one cold iteration a stale draft starts with. Unpriced: warm."""
        state = self.draft_state
        long_stand_down = state.long_without_plan(self.config.probe_interval)
        if state.mode is not Mode.STAND_DOWN or not long_stand_down:
            return True
        n, context = self._deciding_for, self._context_tokens
        extend_ms = self.draft_latency.predict((1, n))
        verify_ms = self.verify_latency.predict((n, context))
        plain_ms = self._plain_price(n, context)
        if extend_ms is None or verify_ms is None or plain_ms is None:
            return True
        # A depth-1 chain over n roots is a draft forward over n rows: the extend's price.
        cold_ms = verify_ms + extend_ms - plain_ms
        due_in = max(state.probe_every - state.plain_run + 1, 1)
        return due_in * extend_ms < cold_ms

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
            self.gain.observe(*note.unread_draft)
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

    def record_at(self, num_requests: int) -> PlanTrackRecord:
        bucket = load_bucket(num_requests)
        record = self.records.get(bucket)
        if record is None:  # built once per load, not on every lookup of the hot path
            record = self.records[bucket] = PlanTrackRecord()
        return record

    def _plain_price(self, num_requests: int, context_tokens: int) -> float | None:
        return self.plain_price.price(self.plain_latency, num_requests, context_tokens)

    def _speculation_pays_alone(self) -> bool:
        """For one request, against a plain decode with no draft work. From a cold plain
        iteration by the switch edge: where speculation about breaks even, the answer would
        flip every iteration."""
        margin = self.record_at(1).required_edge(
            0.0 if self.plain_price.last_warm else self.config.switch_margin
        )
        return self._speculation_pays((1,), margin)

    def _speculation_pays_somewhere(self, coming_load: int) -> bool:
        """At some load up to the most the server has run or `coming_load`, in steps of
        2^(1/4), with no switch edge: doubt keeps the draft."""
        steps = math.ceil(4 * math.log2(max(self._max_load, coming_load, 1)))
        loads = sorted({round(2.0 ** (i / 4)) for i in range(steps + 1)})
        return self._speculation_pays(tuple(loads), 0.0)

    def _speculation_pays(self, loads: tuple[int, ...], margin: float) -> bool:
        """`planner.speculation_pays`, cached on its inputs. Warm plain iterations hold a draft
        forward, taken out of the fitted plain price by their share."""
        verify, plain = self.verify_latency, self.plain_price
        factors = [plain.factor(self.plain_latency, load) for load in loads]
        key = (
            verify.version, self.draft_latency.version, self.gain.version,
            self.acceptance.version, self.plain_latency.version, round(plain.warm_share, 1),
            round(margin * 50), tuple(round(factor * 50) for factor in factors),
        )  # fmt: skip
        cached = self._pays_cache.get(loads)
        if cached is not None and cached[0] == key:
            return cached[1]
        context = self._context_per_request
        n = torch.tensor(loads, dtype=torch.float64)
        plain_ms = self.plain_latency.predict_tensor(n, n * context)
        if plain_ms is not None:
            plain_ms = plain_ms * torch.tensor(factors, dtype=torch.float64)
            extend_ms = self.draft_latency.predict_tensor(1.0, n)
            if extend_ms is not None:
                plain_ms = plain_ms - plain.warm_share * extend_ms
            plain_ms = plain_ms.clamp(min=1e-3) / (1.0 + margin)
        pays = bool(
            speculation_pays(
                gain=self.gain,
                loads=n,
                context_per_request=context,
                verify_ms=verify.predict_tensor,
                draft_ms=self.draft_latency.predict_tensor,
                plain_ms=plain_ms,
            ).any()
        )
        self._pays_cache[loads] = (key, pays)
        return pays

    def _speculates_against_plain_floor(self, slo: SloBatch, planned) -> bool:
        """Whether `planned` speculates even against the cheapest plain iteration measured:
        no batch decodes faster, so a plain decode's price here could not change it."""
        if planned is None or planned.depth == 0:
            return False
        if self.plain_latency.num_observations < FLOOR_MEASUREMENTS:
            return False
        floor = self.plain_latency.min_latency()
        if floor is None:
            return False
        if floor >= planned.plain_ms:  # already planned against a price no dearer
            return True
        return self._cost_plan(slo, floor).depth > 0

    def _speculates_against_draft_floor(self, slo: SloBatch) -> bool:
        """At a load whose draft cost was never measured, whether the plan would speculate
        with the draft priced as at the highest lower load measured: a fit that credits the
        rows can overprice a draft under load several times."""
        n = slo.num_requests
        bucket = load_bucket(n)
        lower = [load for b, load in self._draft_loads.items() if b < bucket]
        if bucket in self._draft_loads or not lower:
            return False
        floor = self._cost_plan(slo, draft_scale=max(lower) / n)
        return floor is not None and floor.depth > 0

    def _report(self, planned, num_requests: int, shape: tuple[int, int] | None = None) -> None:
        """Built when /server_info reads it: building it at each plan cost a tenth of
        adaserve's time."""
        if self._reported == (id(planned), shape):
            return
        self._reported = (id(planned), shape)
        self.stats.plan_report = partial(self._plan_report, planned, num_requests, shape)

    def _plan_report(self, planned, num_requests: int, shape: tuple[int, int] | None) -> dict:
        curve = self.gain.curve(planned.depth, planned.width)
        report = {
            **planned.as_dict(),
            "requests": num_requests,
            "acceptance_curve": self.acceptance.curve(),
            "gain_curve": None if curve is None else [round(x, 3) for x in curve[:9].tolist()],
            "delivered_over_planned": round(self.record_at(num_requests).ratio, 3),
            "wall_per_decode": round(self.wall_per_decode, 3),
            "wall_spread": round(self.wall_spread, 3),
        }
        if shape is not None:
            report.update(depth=shape[0], width=shape[1])
        return report

    def _cost_plan(self, slo: SloBatch, plain_ms: float | None = None, draft_scale: float = 1.0):
        """The plan for the next draft (None until the models can plan), against a plain
        decode at `plain_ms` (None: the fitted price), with the draft priced at `draft_scale`
        times its rows; reused while it serves (`plan_reuse`)."""
        verify = self.verify_latency
        if verify.num_observations < 2 or not self.gain.known:
            return None
        batch = batch_composition(slo)
        fitted_price = plain_ms is None
        batch_plan = fitted_price and draft_scale == 1.0  # not a bound's
        reuse, loads_measured = self.plan_reuse, self.plain_price.loads_measured
        if batch_plan:
            standing = reuse.standing(batch, loads_measured)
            if standing is not None:
                return standing
        if fitted_price:
            plain_ms = self._plain_price(slo.num_requests, self._context_tokens)
        base = self.config.switch_margin if self.draft_state.plain_run > 0 else 0.0
        record = self.record_at(slo.num_requests)
        # Steps of 2 % (5 % for the pace and spread) let a plan survive the inputs' drift. The
        # switch margin is the batch's to clear; a guarded group's own guard is the record's.
        margin = round(record.required_edge(base) * 50) / 50
        guard_margin = round(record.required_edge(0.0) * 50) / 50
        pace = round(self.wall_per_decode * 20) / 20
        spread = round(self.wall_spread * 20) / 20
        # Keyed on observation counts, not fit versions: fits move every iteration. A surprise
        # (a pass larger than any held, priced wrong) is news.
        models = (verify, self.draft_latency, self.plain_latency)
        key = (
            tuple(int(math.log2(1 + model.num_observations)) for model in models),
            tuple(model.surprises for model in models),
            None if not plain_ms else round(20 * math.log(plain_ms)), draft_scale,
        )  # fmt: skip
        made_for = (batch, margin, pace, 1 + self._context_tokens, spread)
        served, planned = reuse.reuse(key, made_for)
        if not served:
            planned = self._plan(slo, plain_ms, draft_scale, margin, guard_margin, pace, spread)
            reuse.keep(key, planned, made_for)
        if batch_plan:
            reuse.note(batch, planned, loads_measured)
        return planned

    def _plan(self, slo, plain_ms, draft_scale, margin, guard_margin, pace, spread):
        verify = self.verify_latency
        verify.coefficients(), self.draft_latency.coefficients()  # refit first where due
        fit = self.acceptance.version // GAIN_RECALIBRATION
        if self._refreshed_for != (self.gain.version, fit):
            self._refreshed_for = (self.gain.version, fit)
            self.gain.refresh(self.acceptance.apply, fit)

        def draft_ms(steps, rows):
            return self.draft_latency.predict_tensor(steps, rows * draft_scale)

        return plan_shape(
            slo=slo,
            context_tokens=self._context_tokens,
            gain=self.gain,
            verify_ms=verify.predict_tensor,
            draft_ms=draft_ms,
            plain_ms=plain_ms or 0.0,
            margin=margin,
            guard_margin=guard_margin,
            wall_per_decode=pace,
            spread=spread,
            max_width=self._load_adaptive_width(slo.num_requests, self.gain.max_width),
        )

    def _load_adaptive_width(self, num_requests: int, widest: int) -> int:
        """Eq. 9's width clipped at `widest`, not the knee rule's W_max: under light load every
        width the draft can run stays a choice."""
        tree = dataclasses.replace(self.config.tree, max_width=max(widest, 1))
        return beam_width(max(num_requests, 1), tree)

    def plan(self, cands: Candidates) -> Plan:
        depth, width = tree_shape(cands.num_requests, self.config.tree)
        budget = self.config.budget
        if budget is None:
            budget = cands.num_requests * (cands.num_nodes + 1)
        return Plan(depth, width, budget)

    def select(
        self,
        cands: Candidates,
        slo: SloBatch,
        draft_depth: int | None = None,
        context_tokens: int = 0,
        draft_width: int | None = None,
    ) -> tuple[Selection, torch.Tensor, Plan, float | None]:
        """The selection, A(r) [B] it was computed for (0: served best effort), the plan it
        followed, and the accepted draft tokens the calibration expects of it (None under the
        knee rule)."""
        plan = self.plan(cands)
        if self.config.budget_rule == "cost":
            # The draft already ran at its own shape: select within it.
            depth = draft_depth if draft_depth is not None else int(cands.max_depth.max())
            plan = Plan(depth, draft_width or plan.width, plan.budget)
        shaped = restrict_to_shape(cands, plan.depth, plan.width)
        cost_rule = self.config.budget_rule == "cost"
        terms = self._slo_terms
        if not cost_rule:  # A(r) for one iteration, as the paper
            infeasible = self._infeasible(slo, plan.depth)
            required = torch.where(infeasible, 0.0, required_tokens(slo, self.t_spec_ms or 0.0))
            terms = _SloTerms(slo, (plan.depth, plan.width), None, infeasible, required, 0.0)
        elif terms is None or terms.slo is not slo or terms.shape != (plan.depth, plan.width):
            terms = self._terms_for(slo, plan.depth, plan.width)  # not planned for this draft
        weight = terms.weight
        if cost_rule:
            # float64 for the outcome's prediction, the draft's dtype for the selection.
            exact = self.acceptance.apply(shaped.path_prob.double())
            calibrated = exact.to(shaped.path_prob.dtype)
            on_plan = self.draft_state.mode is Mode.PLANNED
            if on_plan:
                self._planned_drafts += 1
            if not self.draft_state.cold and (
                not on_plan or self._planned_drafts % READ_PLANNED_EVERY == 0
            ):
                # Read after the verify: before it, the read would wait on the device.
                groups = slo_group_keys(slo.tpot_slo_ms)
                self._unread_draft = (shaped, plan.depth, plan.width, groups, weight)
            budget = cost_budget(
                calibrated,
                shaped.valid,
                terms.sunk_ms,
                context_tokens,
                self.verify_latency.predict_tensor,
            )
            if budget is not None:  # a 0-d tensor on the draft's device
                plan = Plan(plan.depth, plan.width, budget.clamp(max=plan.budget))
            shaped = shaped.with_path_prob(calibrated)
        required = terms.required
        if cost_rule:
            required = required.to(shaped.valid.device, non_blocking=True)
            required = torch.where(beyond_reach(shaped, required), 0.0, required)
        n_max = self.config.max_nodes_per_request
        if n_max is None and self.config.budget_rule == "cost":
            # As AdaServe's public code: a request whose tree cannot reach A(r) does not drain
            # the budget.
            n = cands.num_requests
            spare = (torch.as_tensor(plan.budget, dtype=torch.float64) - n).clamp(min=0.0)
            n_max = torch.ceil(1.2 * spare / n).long()
        elif n_max is None:
            n_max = cands.num_nodes
        selection = select_adaserve(shaped, required, plan.budget, n_max, weight)
        expected = None
        if self.config.budget_rule == "cost":  # a 0-d tensor: read after the verify
            expected = torch.where(selection.mask, exact, 0.0).sum()
        self._selected_infeasible = terms.infeasible
        return selection, required, plan, expected

    def decide(self, it: IterationInput) -> Decision:
        context = int(it.context_lens.sum())
        self._context_tokens = context
        self._context_per_request = context // max(it.cands.num_requests, 1)
        selection, _required, plan, expected = self.select(
            it.cands, it.slo, it.draft_depth, context, it.draft_width
        )
        return Decision(
            selection, plan.depth, plan.width, plan.budget, self._selected_infeasible,
            predicted_accepted=expected,
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


def beyond_reach(cands: Candidates, required: torch.Tensor) -> torch.Tensor:
    """[B] bool: requests whose whole tree, accepted as f' expects, commits less than A(r).
    The SLO phase visits the most-behind first: under overload, requests too far behind would
    take the budget from those it could keep on track."""
    return required > expected_accepted(cands, cands.valid)


@dataclass(frozen=True)
class _SloTerms:
    """What the selection takes of the SLO state for a draft of `shape`, computed when the draft
    is planned (beside the device's work) rather than between the draft and its verify:
    the throughput phase's rank weight [B] (None: f' alone), the requests served best effort
    as beyond any tree [B] bool, A(r) [B] (0 for those), the draft's sunk cost in ms."""

    slo: SloBatch
    shape: tuple[int, int]
    weight: torch.Tensor | None
    infeasible: torch.Tensor
    required: torch.Tensor
    sunk_ms: float


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
