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
from sgl_adaspec.speculative.selection import Selection, select_adaserve
from sgl_adaspec.speculative.stats import SpecStats


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
        if not 0 < self.latency_smoothing <= 1:
            raise ValueError(f"latency_smoothing must be in (0, 1], got {self.latency_smoothing}")


@dataclass(frozen=True)
class Plan:
    """One iteration's decisions: tree shape (d, w) from the load, and the token budget B."""

    depth: int
    width: int
    budget: int


@dataclass
class AdaservePolicy:
    config: AdaserveConfig = field(default_factory=AdaserveConfig)
    # Expected latency of one speculative iteration (draft + verify), ms; None until measured.
    t_spec_ms: float | None = None
    stats: SpecStats = field(default_factory=SpecStats)

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

    # Smoothed latency of the target's verify pass, ms (the online baseline TPOT estimate).
    verify_ms: float | None = None

    def _smooth(self, old: float | None, new: float) -> float:
        alpha = self.config.latency_smoothing
        return new if old is None else (1 - alpha) * old + alpha * new

    def infeasible(self, slo: SloBatch, plan: Plan) -> torch.Tensor:
        """[B] bool: requests whose TPOT SLO cannot be met even alone, i.e. even if every
        iteration (at the current latency t_spec) committed the most a depth-d tree can give,
        d + 1 tokens. They are served best effort so they never take the budget from requests
        that can still be helped (AdaServe 4.3)."""
        if self.t_spec_ms is None:
            return torch.zeros_like(slo.has_slo)
        best_tpot_ms = self.t_spec_ms / (plan.depth + 1)
        return slo.has_slo & (slo.tpot_slo_ms < best_tpot_ms)

    def observe_iteration(self, latency_ms: float) -> None:
        self.t_spec_ms = self._smooth(self.t_spec_ms, latency_ms)
        self.stats.t_spec_ms = self.t_spec_ms

    def observe_verify(self, latency_ms: float) -> None:
        self.verify_ms = self._smooth(self.verify_ms, latency_ms)
        self.stats.baseline_tpot_ms = self.baseline_tpot_ms()

    def baseline_tpot_ms(self) -> float | None:
        if self.config.baseline_tpot_ms is not None:
            return self.config.baseline_tpot_ms
        return self.verify_ms


def restrict_to_shape(cands: Candidates, depth: int, width: int) -> Candidates:
    """The candidates a beam search of depth `depth` and width `width` would have kept: at each
    level the `width` nodes of highest f (ties: lower node index) among the children of the
    nodes kept one level up. Returns the same trees with `valid` narrowed [B, N]."""
    node_depth = cands.depth  # [B, N], 1 = child of the root
    valid = cands.valid & (node_depth <= depth)
    kept = torch.zeros_like(valid)
    index = torch.arange(cands.num_nodes, device=valid.device)
    for level in range(1, depth + 1):
        parent_kept = torch.where(
            cands.parents >= 0,
            torch.gather(kept, 1, cands.parents.clamp(min=0)),
            torch.ones_like(kept),
        )
        at_level = valid & (node_depth == level) & parent_kept  # [B, N]
        if not bool(at_level.any()):
            break
        key = torch.where(at_level, cands.path_prob, -1.0)
        # Stable descending sort: equal f keep node-index order.
        order = torch.sort(key, dim=1, descending=True, stable=True).indices
        rank = torch.empty_like(order).scatter_(1, order, index.expand_as(order))
        kept |= at_level & (rank < width)
    return Candidates(cands.tokens, cands.parents, cands.path_prob, kept)
