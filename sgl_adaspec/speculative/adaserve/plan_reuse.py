"""Plans kept for reuse (`PlanReuse`): planning costs milliseconds and needs move slowly, so a
plan serves up to `PLAN_REUSE` iterations while its batch and inputs stand."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from sgl_adaspec.scheduler.slo import SloBatch
from sgl_adaspec.speculative.adaserve.planner import PlanChoice

PLAN_REUSE = 8
# How far each SLO group's request count may drift from the one a plan was made for.
BATCH_DRIFT = 0.2


def batch_composition(slo: SloBatch) -> dict:
    """What a plan is for: the batch's request count per SLO group (NaN: -1) and blindness to
    the draft."""
    keys = slo.tpot_slo_ms.nan_to_num(-1.0).tolist()
    blind = [False] * len(keys) if slo.draft_blind is None else slo.draft_blind.tolist()
    return Counter(zip(keys, blind))


def same_batch(made_for: dict | None, batch: dict) -> bool:
    """The same SLO groups, each within BATCH_DRIFT of its count. Under load requests come and
    go nearly every iteration: keyed on each request, most iterations would re-plan."""
    return (
        made_for is not None
        and made_for.keys() == batch.keys()
        and all(abs(batch[g] - count) <= BATCH_DRIFT * count for g, count in made_for.items())
    )


@dataclass
class PlanReuse:
    # key -> (plan, uses, made for: (batch, margin, pace, context, spread)); a plan and a
    # floor's at most.
    plans: dict = field(default_factory=dict)
    # The last batch plan that stood down: (plain loads measured, batch, plan, uses).
    standing_down: tuple | None = None

    def standing(self, batch: dict, loads_measured: int) -> PlanChoice | None:
        """The stand-down, while it serves: on its batch even as the plain price moves, so a
        switch to speculation waits at most PLAN_REUSE iterations. A price measured at a new
        load is news, not a refit: it ends a stand-down."""
        standing = self.standing_down
        if (
            standing and standing[0] == loads_measured
            and standing[3] < PLAN_REUSE and same_batch(standing[1], batch)
        ):  # fmt: skip
            self.standing_down = (*standing[:3], standing[3] + 1)
            return standing[2]
        return None

    def reuse(self, key: tuple, made_for: tuple) -> tuple[bool, PlanChoice | None]:
        """(whether the plan under `key` serves, that plan). The margin, the pace and the
        spread serve within one step, the context (1 + tokens) within ~41 %: short prompts
        grow ~10 % per iteration."""
        plan, uses, was = self.plans.get(key, (None, PLAN_REUSE, None))
        batch, margin, pace, context, spread = made_for
        if (
            uses < PLAN_REUSE and same_batch(was[0], batch)
            and abs(margin - was[1]) < 0.03 and abs(pace - was[2]) < 0.06
            and abs(math.log2(context / was[3])) < 0.5 and abs(spread - was[4]) < 0.06
        ):  # fmt: skip
            self.plans[key] = (plan, uses + 1, was)
            return True, plan
        return False, None

    def keep(self, key: tuple, plan: PlanChoice | None, made_for: tuple) -> None:
        if key not in self.plans and len(self.plans) >= 2:
            del self.plans[next(iter(self.plans))]
        self.plans[key] = (plan, 1, made_for)

    def note(self, batch: dict, plan: PlanChoice | None, loads_measured: int) -> None:
        """After a batch plan (not a floor's): kept for reuse where it stands down."""
        standing = plan is not None and plan.depth == 0
        self.standing_down = (loads_measured, batch, plan, 1) if standing else None
