"""adaserve's flags (`AdaserveConfig`): the budget rule, the knee rule's tree shape and the
cost rule's intervals."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from sgl_adaspec.flags import check_flags, flag
from sgl_adaspec.speculative.adaserve.knee_shape import AdaptiveTreeConfig
from sgl_adaspec.speculative.policies.base import check_common_config

BUDGET_RULES = ("cost", "knee")


@dataclass(frozen=True)
class AdaserveConfig:
    """The flags' help says what each means; verify_tokens_per_step / draft_tokens_per_step,
    where set, replace `tree`'s B1 / B2."""

    budget: int | None = flag(
        None,
        "adaserve: tokens verified per iteration across the batch, one root per request "
        "included (default: no budget, every candidate may be verified).",
        metavar="B",
        minimum=1,
    )
    max_nodes_per_request: int | None = flag(
        None,
        "adaserve: n_max, the most draft nodes the SLO-customized phase gives one request "
        "(default: ~1.2 x budget / requests under the cost rule, all of its candidates under "
        "the knee rule).",
        metavar="N",
        minimum=0,
    )
    latency_smoothing: float = 0.3
    budget_rule: str = flag(
        "cost",
        "adaserve: cost (default) sizes speculation by its measured cost and calibrated "
        "acceptance each iteration, down to none where it does not pay (--adaserve-budget then "
        "caps B); knee is the paper's rule: B at the start-up profile's knee, depth from eq. 8.",
        choices=BUDGET_RULES,
    )
    verify_tokens_per_step: int | None = flag(
        None,
        "adaserve: B1 of the load-adaptive depth d = clip(B1 / n - 1, 1, num-steps) for n "
        "running requests (default: the verify budget, --adaserve-budget or the start-up "
        "profile's knee; 256 without either).",
        metavar="B1",
        minimum=1,
    )
    draft_tokens_per_step: int | None = flag(
        None,
        "adaserve: B2 of the load-adaptive beam width w = clip(B2 / n, 1, topk) for n "
        "running requests, the widest beam the cost rule's plan may choose (default: "
        f"{AdaptiveTreeConfig.draft_tokens_per_step}).",
        metavar="B2",
        minimum=1,
    )
    # Plain iterations between two probes (backing off while probes find it does not pay).
    probe_interval: int = 16
    # Speculative iterations between two exploring drafts.
    explore_interval: int = 16
    # From a plain iteration, speculation must beat a plain decode by this much: its price and
    # gain are estimates, and each switch costs a cold draft.
    switch_margin: float = 0.1
    # The throughput phase ranks nodes by f' x `lead_weight` (a request far under its SLO
    # meets it anyway); a floor of 1 ranks by f' alone, as the paper.
    lead_scale: float = 0.3
    lead_floor: float = 0.5
    tree: AdaptiveTreeConfig = field(default_factory=AdaptiveTreeConfig)
    # TPOT without speculation, for relative SLO classes; None: the smoothed verify pass.
    baseline_tpot_ms: float | None = None

    def __post_init__(self) -> None:
        check_flags(self, "adaserve")
        check_common_config(self.latency_smoothing, self.baseline_tpot_ms)
        for name in ("probe_interval", "explore_interval"):
            if getattr(self, name) < 1:
                raise ValueError(f"adaserve {name} must be >= 1, got {getattr(self, name)}")
        if not (self.lead_scale > 0 and 0.0 < self.lead_floor <= 1.0):
            raise ValueError(
                f"adaserve lead_scale must be > 0 and lead_floor in (0, 1], got "
                f"{self.lead_scale}, {self.lead_floor}"
            )
        shape = {
            name: getattr(self, name)
            for name in ("verify_tokens_per_step", "draft_tokens_per_step")
            if getattr(self, name) is not None
        }
        if shape:
            object.__setattr__(self, "tree", dataclasses.replace(self.tree, **shape))

    def with_profile_budget(self, knee: int | None) -> AdaserveConfig:
        """With the start-up profile's `knee` where the flags leave it (--adaserve-budget
        stands for it): the knee rule's B, B1 unless set; the cost rule sizes B itself."""
        knee = knee if self.budget is None else self.budget
        budget = knee if self.budget_rule == "knee" or self.budget is not None else None
        verify_tokens = self.verify_tokens_per_step or knee
        tree = self.tree
        if verify_tokens is not None:
            tree = dataclasses.replace(tree, verify_tokens_per_step=verify_tokens)
        return dataclasses.replace(self, budget=budget, tree=tree)
