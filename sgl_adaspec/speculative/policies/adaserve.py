"""The adaserve policy: per iteration, which of each request's candidate nodes to verify.

Pure (tensors and dataclasses, no SGLang): the SGLang adapter (`speculative/worker.py`) hands it
the candidate trees SGLang's EAGLE draft built and the batch's SLO state, and gets a selection.
State kept across iterations: the smoothed iteration latency t_spec, which A(r) needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sgl_adaspec.scheduler.slo import SloBatch, required_tokens
from sgl_adaspec.speculative.adaptive import AdaptiveTreeConfig, tree_shape
from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.policies.base import (
    Decision,
    IterationInput,
    PolicyBase,
    check_common_config,
)
from sgl_adaspec.speculative.selection import Selection, select_adaserve
from sgl_adaspec.speculative.shapes import restrict_to_shape


@dataclass(frozen=True)
class AdaserveConfig:
    """budget: verified tokens per iteration, roots included (None: every candidate, i.e. no
    budget pressure); max_nodes_per_request: n_max of the SLO phase (None: all candidates);
    latency_smoothing: weight of the newest measurement in the t_spec moving average."""

    budget: int | None = None
    max_nodes_per_request: int | None = None
    latency_smoothing: float = 0.3
    tree: AdaptiveTreeConfig = field(default_factory=AdaptiveTreeConfig)
    # TPOT without speculation, for SLO classes relative to it; None: estimated online as the
    # smoothed latency of the target's verify pass (one target forward, like a plain decode step).
    baseline_tpot_ms: float | None = None

    def __post_init__(self) -> None:
        if self.budget is not None and self.budget < 1:
            raise ValueError(f"adaserve budget must be >= 1, got {self.budget}")
        if self.max_nodes_per_request is not None and self.max_nodes_per_request < 0:
            raise ValueError(f"max_nodes_per_request must be >= 0, got {self.max_nodes_per_request}")
        check_common_config(self.latency_smoothing, self.baseline_tpot_ms)


@dataclass(frozen=True)
class Plan:
    """One iteration's decisions: tree shape (d, w) from the load, and the token budget B."""

    depth: int
    width: int
    budget: int


@dataclass
class AdaservePolicy(PolicyBase):
    config: AdaserveConfig = field(default_factory=AdaserveConfig)

    def __post_init__(self) -> None:
        self.latency_smoothing = self.config.latency_smoothing
        self.baseline_tpot_ms_config = self.config.baseline_tpot_ms
        super().__post_init__()

    def draft_shape(self, num_requests: int, steps: int, topk: int) -> tuple[int, int]:
        """Eq. 8-9: the load-adaptive (d, w), so the draft's own work shrinks under load."""
        depth, width = tree_shape(num_requests, self.config.tree)
        return min(depth, steps), min(width, topk)

    def plan(self, cands: Candidates) -> Plan:
        depth, width = tree_shape(cands.num_requests, self.config.tree)
        budget = self.config.budget
        if budget is None:
            budget = cands.num_requests * (cands.num_nodes + 1)
        return Plan(depth, width, budget)

    def select(
        self, cands: Candidates, slo: SloBatch
    ) -> tuple[Selection, torch.Tensor, Plan]:
        """Returns the selection, A(r) [B] it was computed for (0 for requests served best
        effort, see `infeasible`), and the plan it followed."""
        plan = self.plan(cands)
        shaped = restrict_to_shape(cands, plan.depth, plan.width)
        required = required_tokens(slo, self.t_spec_ms or 0.0)
        required = torch.where(self.infeasible(slo, plan), 0.0, required)
        n_max = self.config.max_nodes_per_request
        selection = select_adaserve(
            shaped, required, plan.budget, cands.num_nodes if n_max is None else n_max
        )
        return selection, required, plan

    def decide(self, it: IterationInput) -> Decision:
        selection, _required, plan = self.select(it.cands, it.slo)
        return Decision(
            selection, plan.depth, plan.width, plan.budget, self.infeasible(it.slo, plan)
        )

    def infeasible(self, slo: SloBatch, plan: Plan) -> torch.Tensor:
        """[B] bool: requests whose TPOT SLO cannot be met even alone, i.e. even if every
        iteration (at the current latency t_spec) committed the most a depth-d tree can give,
        d + 1 tokens. They are served best effort so they never take the budget from requests
        that can still be helped (AdaServe 4.3)."""
        if self.t_spec_ms is None:
            return torch.zeros_like(slo.has_slo)
        best_tpot_ms = self.t_spec_ms / (plan.depth + 1)
        return slo.has_slo & (slo.tpot_slo_ms < best_tpot_ms)
