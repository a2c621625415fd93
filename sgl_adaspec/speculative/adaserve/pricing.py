"""What adaserve's plans cost and return, on the policy's measured models: the plan for the
next draft (`planner.plan_shape`, reused while it serves: `plan_reuse`) and its report, the
price of a plain decode, whether speculation pays at a load, and what the mode machine
(`modes.next_draft`) asks besides the plan: the plain and draft floors, a probe's cost, an
exploring draft's shape, whether a warm stand-down pays. `AdaservePolicy` (`policy.py`)
inherits it and decides each iteration on it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from functools import partial
from typing import ClassVar

import torch

from sgl_adaspec.scheduler.slo import SloBatch
from sgl_adaspec.speculative.adaserve.config import AdaserveConfig
from sgl_adaspec.speculative.adaserve.gain_table import ShapeGain
from sgl_adaspec.speculative.adaserve.knee_shape import beam_width
from sgl_adaspec.speculative.adaserve.modes import DraftState, Mode
from sgl_adaspec.speculative.adaserve.plain_price import PlainPrice
from sgl_adaspec.speculative.adaserve.plan_reuse import PlanReuse, batch_composition
from sgl_adaspec.speculative.adaserve.planner import plan_shape, speculation_pays
from sgl_adaspec.speculative.adaserve.track_record import PlanTrackRecord, load_bucket
from sgl_adaspec.speculative.policies.base import PolicyBase
from sgl_adaspec.speculative.shapes import draft_rows

# Calibration outcomes between two recalibrations of the gain table's kept drafts:
# recalibrating at every plan was most of a plan's time.
GAIN_RECALIBRATION = 8
# The most an exploring full search may cost beyond the planned draft, as a share of the
# planned iteration; past it the exploring draft is a chain.
EXPLORE_COST = 0.25
# Plain iterations measured before their cheapest bounds a plain decode's price: the first
# few, right after start-up, may all be stalled.
FLOOR_MEASUREMENTS = 4


@dataclass
class AdaservePricing(PolicyBase):
    """Adaserve's flags and the state its plans are priced from: the gain table, a plain
    decode's price per load, the plans kept for reuse and their track records per load, the
    mode machine's state (`modes.DraftState`, which the policy moves on), the context and the
    loads seen."""

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
    plain_price: PlainPrice = field(default_factory=PlainPrice)
    _draft_loads: dict = field(default_factory=dict, repr=False)  # bucket -> a priced load
    plan_reuse: PlanReuse = field(default_factory=PlanReuse, repr=False)
    _refreshed_for: tuple | None = field(default=None, repr=False)  # gain version, calibration
    _reported: tuple = field(default=(None, None), repr=False)  # what stats.last_plan shows
    # Per `load_bucket`: the cost models' errors depend on the load.
    records: dict[int, PlanTrackRecord] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.latency_smoothing = self.config.latency_smoothing
        self.baseline_tpot_ms_config = self.config.baseline_tpot_ms
        self.draft_state = DraftState(probe_every=self.config.probe_interval)
        super().__post_init__()

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
