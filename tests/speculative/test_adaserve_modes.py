"""adaserve's draft modes (`adaserve.modes.next_draft`) on their own: each transition from a
given state and the policy's answers, its mode, shape and the state it leaves."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from sgl_adaspec.speculative.adaserve.modes import (
    BLIND_AFTER,
    FIRST_REMEASURE,
    PROBE_BACKOFF,
    REMEASURE_PLAIN,
    REMEASURE_RUN,
    DraftState,
    Mode,
    next_draft,
)
from sgl_adaspec.speculative.adaserve.planner import PlanChoice

FULL = (4, 2)
PROBE_INTERVAL = 4
EXPLORE_INTERVAL = 3


def choice(depth: int, width: int = 1) -> PlanChoice:
    return PlanChoice(depth, width, depth, 1.0, 0.1, 0.1, 10.0, 10.0)


@dataclass
class Answers:
    """`DraftQuestions` with fixed answers; `asked` records the questions asked, in order."""

    planned: PlanChoice | None = None
    plain_floor: bool = False
    sees_draft: bool = True
    affordable: bool = True
    draft_floor: bool = False
    explored: tuple[int, int] = FULL
    asked: list = field(default_factory=list)

    def plan(self):
        self.asked.append("plan")
        return self.planned

    def speculates_against_plain_floor(self, planned):
        self.asked.append("plain floor")
        return self.plain_floor

    def readable(self):
        self.asked.append("readable")
        return self.sees_draft

    def can_afford_probe(self, planned, stale):
        self.asked.append(("afford", stale))
        return self.affordable

    def speculates_against_draft_floor(self):
        self.asked.append("draft floor")
        return self.draft_floor

    def explore_shape(self, planned):
        self.asked.append("explore")
        return self.explored


def step(state: DraftState, answers: Answers, measured: bool = True, has_slo: bool = True):
    return next_draft(
        state,
        answers,
        full=FULL,
        measured=measured,
        has_slo=has_slo,
        probe_interval=PROBE_INTERVAL,
        explore_interval=EXPLORE_INTERVAL,
    )


def fresh(**changes) -> DraftState:
    return replace(DraftState(probe_every=PROBE_INTERVAL), **changes)


def test_a_running_remeasurement_runs_plain_without_asking_for_a_plan():
    answers = Answers(planned=choice(2))
    draft = step(fresh(remeasure_left=1, plain_run=1, since_plain=5), answers)
    assert (draft.state.mode, draft.shape, draft.plan) == (Mode.MEASURE_PLAIN, (0, 2), None)
    assert draft.state.remeasure_left == 0 and draft.state.plain_run == 2
    assert draft.state.since_plain == 0 and draft.state.since_planned == 1
    assert answers.asked == []


def test_an_unmeasured_load_without_slo_state_runs_plain():
    answers = Answers(planned=choice(2))
    draft = step(fresh(), answers, measured=False, has_slo=False)
    assert (draft.state.mode, draft.shape) == (Mode.MEASURE_PLAIN, (0, 2))
    assert answers.asked == []


def test_an_unmeasured_load_runs_plain_where_its_price_could_change_the_plan():
    answers = Answers(planned=choice(2), plain_floor=False)
    draft = step(fresh(), answers, measured=False)
    assert (draft.state.mode, draft.shape, draft.plan) == (Mode.MEASURE_PLAIN, (0, 2), choice(2))
    assert answers.asked == ["plan", "plain floor"]


def test_an_unmeasured_load_speculates_where_the_plan_beats_any_plain_price():
    answers = Answers(planned=choice(2), plain_floor=True)
    draft = step(fresh(), answers, measured=False)
    assert (draft.state.mode, draft.shape) == (Mode.PLANNED, (2, 1))


def test_a_plan_of_depth_0_stands_down_until_a_probe_is_due():
    answers = Answers(planned=choice(0))
    draft = step(fresh(plain_run=PROBE_INTERVAL - 1, since_plain=3), answers)
    assert (draft.state.mode, draft.shape) == (Mode.STAND_DOWN, (0, 2))
    assert draft.state.plain_run == PROBE_INTERVAL and draft.state.since_plain == 0
    assert draft.state.probe_left == 0 and draft.state.mode.reason == "stand down"
    assert answers.asked == ["plan", "readable", "draft floor"]


def test_a_due_probe_waits_while_a_request_on_track_cannot_afford_it():
    answers = Answers(planned=choice(0), affordable=False)
    draft = step(fresh(plain_run=PROBE_INTERVAL, stale=True), answers)
    assert (draft.state.mode, draft.shape) == (Mode.STAND_DOWN, (0, 2))
    assert ("afford", True) in answers.asked  # priced as the cold chain it would start with


def test_no_probe_while_every_request_is_blind_to_the_draft():
    answers = Answers(planned=choice(0), sees_draft=False, draft_floor=True)
    draft = step(fresh(plain_run=10 * PROBE_INTERVAL), answers)
    assert draft.state.mode is Mode.STAND_DOWN
    assert answers.asked == ["plan", "readable"]


def test_a_due_probe_runs_two_drafts_and_backs_off():
    answers = Answers(planned=choice(0))
    first = step(fresh(plain_run=PROBE_INTERVAL, stale=True), answers)
    # The stale draft's first probing draft is the cold chain, still counted as the probe.
    assert (first.state.mode, first.shape) == (Mode.PROBE, (1, 1))
    assert first.state.cold and not first.state.stale and first.state.plain_run == 0
    assert first.state.probe_left == 1 and first.state.probe_every == 2 * PROBE_INTERVAL
    second = step(first.state, answers)
    assert (second.state.mode, second.shape) == (Mode.PROBE, FULL)
    assert second.state.probe_left == 0 and not second.state.cold
    assert second.state.probe_every == 2 * PROBE_INTERVAL  # asked once per probe


def test_a_probe_finishes_whatever_the_plan_says_meanwhile():
    draft = step(fresh(probe_left=1, since_plain=2), Answers(planned=choice(2)))
    assert (draft.state.mode, draft.shape) == (Mode.PROBE, FULL)
    assert draft.state.since_plain == 2 and draft.state.since_planned == 1  # not a planned one


def test_the_probes_backoff_stops_at_its_cap():
    cap = PROBE_BACKOFF * PROBE_INTERVAL
    draft = step(fresh(plain_run=cap, probe_every=cap), Answers(planned=choice(0)))
    assert draft.state.mode is Mode.PROBE and draft.state.probe_every == cap


def test_a_draft_cost_extrapolated_to_this_load_is_probed_outside_the_backoff():
    answers = Answers(planned=choice(0), draft_floor=True)
    draft = step(fresh(plain_run=0), answers)
    assert (draft.state.mode, draft.shape) == (Mode.PROBE, FULL)
    assert draft.state.probe_every == PROBE_INTERVAL


def test_a_stale_draft_state_is_warmed_by_a_cold_chain():
    draft = step(fresh(stale=True, plain_run=3), Answers(planned=choice(3, 2)))
    assert (draft.state.mode, draft.shape) == (Mode.COLD, (1, 1))
    assert draft.state.cold and not draft.state.stale and draft.state.plain_run == 0
    assert draft.state.mode.reason == "cold"
    assert step(draft.state, Answers(planned=choice(3, 2))).state.mode is Mode.PLANNED


def test_without_a_plan_the_full_search_runs():
    draft = step(fresh(), Answers(planned=None))
    assert (draft.state.mode, draft.shape, draft.plan) == (Mode.UNPLANNED, FULL, None)
    assert draft.state.since_explore == 0 and draft.state.since_planned == 1


def test_a_plan_that_speculates_runs_its_shape():
    draft = step(fresh(since_planned=7, since_plain=2, since_explore=0), Answers(planned=choice(2)))
    assert (draft.state.mode, draft.shape) == (Mode.PLANNED, (2, 1))
    assert draft.state.since_planned == 0 and draft.state.since_plain == 3
    assert draft.state.since_explore == 1 and draft.state.mode.speculates


def test_every_explore_interval_drafts_alternate_the_full_search_and_a_chain():
    state, answers = fresh(), Answers(planned=choice(2), explored=(4, 2))
    modes, shapes = [], []
    for _ in range(2 * EXPLORE_INTERVAL):
        draft = step(state, answers)
        state = draft.state
        modes.append(state.mode)
        shapes.append(draft.shape)
    planned = [Mode.PLANNED] * (EXPLORE_INTERVAL - 1)
    assert modes == [*planned, Mode.EXPLORE, *planned, Mode.EXPLORE]
    assert shapes == [(2, 1), (2, 1), (4, 2), (2, 1), (2, 1), (1, 1)]
    assert state.explores == 2


def test_an_exploring_draft_of_the_planned_shape_is_a_planned_one():
    # The plan's shape is the depth-1 chain: the chain's exploring turn drafts just that.
    state = fresh(since_explore=EXPLORE_INTERVAL - 1, explores=1)
    draft = step(state, Answers(planned=choice(1)))
    assert (draft.state.mode, draft.shape) == (Mode.PLANNED, (1, 1))
    assert draft.state.since_explore == EXPLORE_INTERVAL  # not reset: explores next time too


def test_speculation_held_for_a_probe_interval_resets_the_backoff():
    state = fresh(probe_every=8 * PROBE_INTERVAL, since_plain=PROBE_INTERVAL - 2)
    assert step(state, Answers(planned=choice(2))).state.probe_every == 8 * PROBE_INTERVAL
    state = replace(state, since_plain=PROBE_INTERVAL - 1)
    assert step(state, Answers(planned=choice(2))).state.probe_every == PROBE_INTERVAL


def test_planned_speculation_remeasures_a_plain_decode_now_and_then():
    answers = Answers(planned=choice(2), plain_floor=False)
    draft = step(fresh(since_plain=FIRST_REMEASURE - 1), answers)
    assert (draft.state.mode, draft.shape) == (Mode.MEASURE_PLAIN, (0, 2))
    assert draft.state.remeasure_left == REMEASURE_RUN - 1
    assert draft.state.remeasure_every == 2 * FIRST_REMEASURE
    assert draft.state.since_plain == 0 and draft.state.since_planned == 0
    follow = step(draft.state, answers)
    assert follow.state.mode is Mode.MEASURE_PLAIN and follow.state.remeasure_left == 0
    capped = step(fresh(since_plain=REMEASURE_PLAIN - 1, remeasure_every=REMEASURE_PLAIN), answers)
    assert capped.state.remeasure_every == REMEASURE_PLAIN


def test_no_remeasurement_where_the_plan_beats_any_plain_price():
    answers = Answers(planned=choice(2), plain_floor=True)
    draft = step(fresh(since_plain=FIRST_REMEASURE - 1), answers)
    assert (draft.state.mode, draft.shape) == (Mode.PLANNED, (2, 1))
    assert draft.state.since_plain == 0 and draft.state.remeasure_every == 2 * FIRST_REMEASURE


def test_a_plain_iteration_that_skipped_the_extend_leaves_the_draft_stale():
    state = fresh()
    assert state.observed(warm=True) is state
    assert state.observed(warm=False).stale
    assert replace(state, stale=True).observed(warm=True).stale  # until a draft warms it


def test_the_reasons_the_decision_log_names():
    reasons = {mode: mode.reason for mode in Mode}
    assert reasons == {
        Mode.MEASURE_PLAIN: "measure plain",
        Mode.STAND_DOWN: "stand down",
        Mode.PROBE: "probe",
        Mode.COLD: "cold",
        Mode.UNPLANNED: "unplanned",
        Mode.EXPLORE: "explore",
        Mode.PLANNED: "planned",
        Mode.KNEE: "",
    }
    assert fresh().reason == ""  # no draft decided yet
    assert [mode for mode in Mode if not mode.speculates] == [Mode.MEASURE_PLAIN, Mode.STAND_DOWN]


@pytest.mark.parametrize("since_planned, long", [(BLIND_AFTER * PROBE_INTERVAL - 1, False),
                                                 (BLIND_AFTER * PROBE_INTERVAL, True)])  # fmt: skip
def test_a_long_time_without_planned_speculation(since_planned, long):
    assert fresh(since_planned=since_planned).long_without_plan(PROBE_INTERVAL) is long
