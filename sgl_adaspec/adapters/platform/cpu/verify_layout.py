"""What the plugin's torch attention backend is told of the verify it runs, and what it finds:
the layout of one iteration's verify, in a context variable the adapter sets around the
iteration (`verify_layout_scope`), so the platform layer reads it without importing the
adapter above it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from sgl_adaspec.adapters.platform.cpu.graph_emulation import sealed


@dataclass
class VerifyLayout:
    """- nodes: per request, the kept node indices while a ragged verify runs (None: the
      whole [bs, ntok] tree); set by the adapter, narrowed by the early exit;
    - one_token_slots_in_row: a one-node verify's KV slots follow each request's prefix in
      its `req_to_token` row (the backend's check, once per iteration; None: not asked, so
      the one-node path did not run)."""

    nodes: list[torch.Tensor] | None = None
    one_token_slots_in_row: bool | None = None


_LAYOUT: contextvars.ContextVar[VerifyLayout | None] = contextvars.ContextVar(
    "adaspec_verify_layout", default=None
)


def verify_layout() -> VerifyLayout | None:
    """The layout of the verify in progress in this thread, or None (outside an iteration, and
    inside a captured region: on a GPU, Python there runs only at capture)."""
    return None if sealed() else _LAYOUT.get()


@contextlib.contextmanager
def verify_layout_scope(layout: VerifyLayout) -> Iterator[VerifyLayout]:
    token = _LAYOUT.set(layout)
    try:
        yield layout
    finally:
        _LAYOUT.reset(token)
