"""The adaserve policy: per iteration, which of each request's candidate nodes to verify.

Pure (tensors and dataclasses, no SGLang): the SGLang adapter (`speculative/worker.py`) hands it
the candidate trees SGLang's EAGLE draft built and the batch's SLO state, and gets a selection.
State kept across iterations: the smoothed iteration latency t_spec, which A(r) needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sgl_adaspec.scheduler.slo import SloBatch, required_tokens
from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.selection import Selection, select_adaserve


@dataclass(frozen=True)
class AdaserveConfig:
    """budget: verified tokens per iteration, roots included (None: every candidate, i.e. no
    budget pressure); max_nodes_per_request: n_max of the SLO phase (None: all candidates);
    latency_smoothing: weight of the newest measurement in the t_spec moving average."""

    budget: int | None = None
    max_nodes_per_request: int | None = None
    latency_smoothing: float = 0.3

    def __post_init__(self) -> None:
        if self.budget is not None and self.budget < 1:
            raise ValueError(f"adaserve budget must be >= 1, got {self.budget}")
        if self.max_nodes_per_request is not None and self.max_nodes_per_request < 0:
            raise ValueError(f"max_nodes_per_request must be >= 0, got {self.max_nodes_per_request}")
        if not 0 < self.latency_smoothing <= 1:
            raise ValueError(f"latency_smoothing must be in (0, 1], got {self.latency_smoothing}")


@dataclass
class AdaservePolicy:
    config: AdaserveConfig = field(default_factory=AdaserveConfig)
    # Expected latency of one speculative iteration (draft + verify), ms; None until measured.
    t_spec_ms: float | None = None

    def budget_for(self, cands: Candidates) -> int:
        if self.config.budget is not None:
            return self.config.budget
        return cands.num_requests * (cands.num_nodes + 1)

    def select(self, cands: Candidates, slo: SloBatch) -> tuple[Selection, torch.Tensor]:
        """Returns the selection and A(r) [B] it was computed for."""
        required = required_tokens(slo, self.t_spec_ms or 0.0)
        n_max = self.config.max_nodes_per_request
        selection = select_adaserve(
            cands,
            required,
            self.budget_for(cands),
            cands.num_nodes if n_max is None else n_max,
        )
        return selection, required

    def observe_iteration(self, latency_ms: float) -> None:
        if self.t_spec_ms is None:
            self.t_spec_ms = latency_ms
            return
        alpha = self.config.latency_smoothing
        self.t_spec_ms = (1 - alpha) * self.t_spec_ms + alpha * latency_ms
