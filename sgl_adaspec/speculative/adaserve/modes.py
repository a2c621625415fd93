"""The modes of adaserve's drafts under the cost rule, and the one transition between them
(`next_draft`). Pure but for the questions it asks of the policy (`DraftQuestions`), each only
where its answer decides, in a fixed order: some of them plan, and plans are cached.

- MEASURE_PLAIN: plain, to measure a plain decode's price at this load (or re-measure it);
- STAND_DOWN: plain, as the plan says speculation does not pay;
- PROBE: two drafts (a cold chain where the draft is stale, then the full search) that measure
  what speculation returns while standing down, every `probe_every` plain iterations;
- COLD: a depth-1 chain that warms a draft state left stale by plain iterations;
- UNPLANNED: the full search, until the models can plan;
- EXPLORE: the full search or a depth-1 chain instead of the plan's shape, every
  `explore_interval` drafts, so the gain of other shapes and the draft's cost per step stay known;
- PLANNED: the plan's shape;
- KNEE: the knee rule's shape (eq. 8-9), outside this machine.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Protocol

from sgl_adaspec.speculative.adaserve.planner import PlanChoice

# Planned speculative drafts between two plain re-measurements: FIRST_REMEASURE, doubling to
# REMEASURE_PLAIN (early ones expose a stalled measurement).
FIRST_REMEASURE = 8
REMEASURE_PLAIN = 128
# Plain iterations of one re-measurement: only the second is a steady price.
REMEASURE_RUN = 2
# The most a probe's interval grows to, in `probe_interval`s: each probe runs two drafts.
PROBE_BACKOFF = 64
# Drafts without planned speculation, in `probe_interval`s, before a stand-down is long
# (`DraftState.long_without_plan`).
BLIND_AFTER = 4


class Mode(enum.Enum):
    MEASURE_PLAIN = "measure plain"
    STAND_DOWN = "stand down"
    PROBE = "probe"
    COLD = "cold"
    UNPLANNED = "unplanned"
    EXPLORE = "explore"
    PLANNED = "planned"
    KNEE = "knee"

    @property
    def speculates(self) -> bool:
        return self not in (Mode.MEASURE_PLAIN, Mode.STAND_DOWN)

    @property
    def reason(self) -> str:
        """The decision log's `reason`; the knee rule's shape needs none."""
        return "" if self is Mode.KNEE else self.value


@dataclass(frozen=True)
class DraftState:
    """What the transition carries from one draft to the next."""

    probe_every: int  # plain iterations between probes, backing off while probes fail
    mode: Mode | None = None  # the last draft's (None: none decided yet)
    plain_run: int = 0  # plain iterations since the last draft
    probe_left: int = 0  # drafts the running probe still has
    cold: bool = False  # the last draft ran on a stale draft state
    stale: bool = False  # a plain iteration since then skipped the draft extend
    since_planned: int = 0  # drafts decided since the plan last speculated
    since_plain: int = 0  # planned drafts since the last plain iteration
    since_explore: int = 0  # drafts since the last exploring one
    explores: int = 0
    remeasure_every: int = FIRST_REMEASURE
    remeasure_left: int = 0  # plain iterations the re-measurement still runs

    @property
    def reason(self) -> str:
        return "" if self.mode is None else self.mode.reason

    def observed(self, warm: bool) -> DraftState:
        """After an iteration; `warm`: it drafted, or kept the draft's state. One that did
        neither leaves the next draft stale."""
        return self if self.stale or warm else replace(self, stale=True)

    def long_without_plan(self, probe_interval: int) -> bool:
        return self.since_planned >= BLIND_AFTER * probe_interval


class DraftQuestions(Protocol):
    """What `next_draft` asks of the policy about this iteration's batch."""

    def plan(self) -> PlanChoice | None: ...

    def speculates_against_plain_floor(self, planned: PlanChoice | None) -> bool: ...

    def readable(self) -> bool:
        """Whether some running request sees the draft (is not blind to it)."""

    def can_afford_probe(self, planned: PlanChoice, stale: bool) -> bool: ...

    def speculates_against_draft_floor(self) -> bool: ...

    def explore_shape(self, planned: PlanChoice) -> tuple[int, int]: ...


@dataclass(frozen=True)
class NextDraft:
    state: DraftState  # its `mode` is this draft's
    shape: tuple[int, int]  # depth 0: plain
    plan: PlanChoice | None  # the plan asked for (None: not asked, or none yet)


def next_draft(
    state: DraftState,
    ask: DraftQuestions,
    *,
    full: tuple[int, int],
    measured: bool,
    has_slo: bool,
    probe_interval: int,
    explore_interval: int,
) -> NextDraft:
    """The cost rule's next draft from `state`: `full` is the configured search (steps, topk),
    `measured` whether a plain decode's price is measured at this load (within 2x)."""
    since_planned = state.since_planned + 1

    def plain(mode: Mode, planned: PlanChoice | None, **changes) -> NextDraft:
        changes.setdefault("since_planned", since_planned)
        after = replace(state, mode=mode, plain_run=state.plain_run + 1, since_plain=0, **changes)
        return NextDraft(after, (0, full[1]), planned)

    if state.remeasure_left > 0 or (not measured and not has_slo):
        return plain(Mode.MEASURE_PLAIN, None, remeasure_left=max(state.remeasure_left - 1, 0))
    planned = ask.plan()
    # Where a plain decode's price could change the plan, it is measured, not extrapolated.
    if not measured and not ask.speculates_against_plain_floor(planned):
        return plain(Mode.MEASURE_PLAIN, planned)
    probe_left, probe_every = state.probe_left, state.probe_every
    since_plain, remeasure_every = state.since_plain, state.remeasure_every
    if planned is not None and planned.depth == 0:
        # A probe with every request blind to the draft would measure nothing.
        readable = ask.readable()
        due = state.plain_run >= probe_every and readable
        affordable = due and ask.can_afford_probe(planned, state.stale)
        # A draft cost extrapolated to this load is measured by a probe outside the backoff.
        measure = probe_left == 0 and readable and ask.speculates_against_draft_floor()
        if probe_left == 0 and not (affordable or measure):
            return plain(Mode.STAND_DOWN, planned)
        if probe_left == 0:
            probe_left = 2
            if not measure:
                probe_every = min(2 * probe_every, PROBE_BACKOFF * probe_interval)
    elif planned is not None and probe_left == 0:
        since_planned = 0
        since_plain += 1
        if since_plain >= probe_interval:
            # Speculation held for a probe interval: a later stand-down probes at the base
            # rate again (not after a probe's lucky draft alone).
            probe_every = probe_interval
        if since_plain >= remeasure_every:
            remeasure_every = min(2 * remeasure_every, REMEASURE_PLAIN)
            # Unless the plan speculates whatever a plain decode costs, its price is
            # re-measured now and then: it may have been a stalled one, or the context grew.
            if not ask.speculates_against_plain_floor(planned):
                return plain(
                    Mode.MEASURE_PLAIN, planned, since_planned=since_planned,
                    probe_every=probe_every, remeasure_every=remeasure_every,
                    remeasure_left=REMEASURE_RUN - 1,
                )  # fmt: skip
            since_plain = 0
    # A stale draft state is warmed by the cheapest draft, whose gain says nothing.
    cold = state.stale
    probing = probe_left > 0
    since_explore, explores = state.since_explore, state.explores
    if cold:
        shape = (1, 1)
    elif planned is None or probing:
        shape = full
    elif since_explore + 1 >= explore_interval:
        # Alternately the full search (every shape's gain) and a depth-1 chain (the draft's
        # fixed cost apart from its cost per step).
        explores += 1
        shape = ask.explore_shape(planned) if explores % 2 else (1, 1)
    else:
        shape = (planned.depth, planned.width)
    explored = planned is None or shape != (planned.depth, planned.width)
    if probing:
        mode = Mode.PROBE
    elif cold:
        mode = Mode.COLD
    elif planned is None:
        mode = Mode.UNPLANNED
    else:
        mode = Mode.EXPLORE if explored else Mode.PLANNED
    after = DraftState(
        probe_every=probe_every,
        mode=mode,
        plain_run=0,
        probe_left=max(probe_left - 1, 0),
        cold=cold,
        stale=False,
        since_planned=since_planned,
        since_plain=since_plain,
        since_explore=0 if explored else since_explore + 1,
        explores=explores,
        remeasure_every=remeasure_every,
        remeasure_left=state.remeasure_left,
    )
    return NextDraft(after, shape, planned)
