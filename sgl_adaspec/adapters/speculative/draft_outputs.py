"""The draft's outputs as its captured graph returns them: SGLang's four, plus the kept nodes'
path probabilities.

On CUDA the draft (`draft_forward`) runs as a graph replay, where no Python runs: a value the
policy needs must be a tensor the graph itself writes. `organize_draft_results` (inside the
draft) computes the path probabilities as tensor work and hands them, within the same call, to
the enclosing `draft_forward` hook, which returns them as `DraftOutputs.path_prob`. SGLang's
graph backend keeps that capture-time object and returns it at every replay, its tensors
rewritten by the replay.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

import torch


class DraftOutputs(tuple):
    """(parent_list, top_scores_index, draft_tokens, draft_probs) as SGLang's `draft_forward`
    returns them, and path_prob [bs, num_draft - 1] (f of the kept nodes, SGLang's node order,
    root excluded; None where the draft kept no tree, as on its top-k 1 chain paths)."""

    path_prob: torch.Tensor | None

    def __new__(cls, outputs, path_prob: torch.Tensor | None) -> DraftOutputs:
        self = super().__new__(cls, outputs)
        self.path_prob = path_prob
        return self


@dataclass
class _Collected:
    path_prob: torch.Tensor | None = None


_COLLECTING: contextvars.ContextVar[_Collected | None] = contextvars.ContextVar(
    "adaspec_draft_path_prob", default=None
)


@contextlib.contextmanager
def collect_path_prob() -> Iterator[_Collected]:
    """Scope of one `draft_forward` call: what `hand_path_prob` hands inside it."""
    collected = _Collected()
    token = _COLLECTING.set(collected)
    try:
        yield collected
    finally:
        _COLLECTING.reset(token)


def hand_path_prob(path_prob: torch.Tensor) -> None:
    """From inside the draft: its kept nodes' path probabilities [bs, num_draft - 1]."""
    collected = _COLLECTING.get()
    if collected is not None:
        collected.path_prob = path_prob
