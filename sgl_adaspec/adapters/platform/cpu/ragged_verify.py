"""The ragged verify's forward metadata: SGLang's verify input plus, per request, the tree nodes
the verify runs, read by the plugin's torch attention backend off the forward batch it is
given. The adapter hands it in for the verify's forward (`ragged_verify`); faser's early exit
narrows it between layers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from sglang.srt.speculative.eagle_info import EagleVerifyInput


class RaggedVerifyInput(EagleVerifyInput):
    """SGLang's `EagleVerifyInput` with kept_nodes: [bs] int64 tensors, each request's tree
    nodes the verify runs (node order; the forward batch holds their rows packed in that
    order). Made by `ragged_verify` only."""

    kept_nodes: list[torch.Tensor]


@contextlib.contextmanager
def ragged_verify(forward_batch, kept_nodes: list[torch.Tensor]) -> Iterator[RaggedVerifyInput]:
    """`forward_batch.spec_info` as a `RaggedVerifyInput` for the forward inside; what the
    forward sets on it is carried back to SGLang's input after, so nothing of the copy is
    lost and nothing of the ragged verify stays on SGLang's objects."""
    original = forward_batch.spec_info
    ragged = object.__new__(RaggedVerifyInput)
    ragged.__dict__.update(original.__dict__)
    ragged.kept_nodes = kept_nodes
    forward_batch.spec_info = ragged
    try:
        yield ragged
    finally:
        forward_batch.spec_info = original
        for name, value in ragged.__dict__.items():
            if name != "kept_nodes" and original.__dict__.get(name) is not value:
                setattr(original, name, value)
