"""`ADASPEC_COUNT_HOST_READS=1` (tests and benchmarks): the server counts the host reads the
plugin makes of device-resident tensors between the draft and the verify (`host_reads`), in
the policy's stats (`host_reads_before_verify`, and where they were made)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from sgl_adaspec.speculative.host_reads import HostReadCounter

COUNT_HOST_READS_ENV = "ADASPEC_COUNT_HOST_READS"


def counting() -> bool:
    value = os.environ.get(COUNT_HOST_READS_ENV, "0")
    if value not in ("0", "1"):
        raise ValueError(f"{COUNT_HOST_READS_ENV} must be 0 or 1, got {value!r}")
    return value == "1"


@contextlib.contextmanager
def counted_host_reads() -> Iterator[HostReadCounter | None]:
    """The counter over the block where counting is on; None (nothing counted) otherwise."""
    if not counting():
        yield None
        return
    with HostReadCounter() as counter:
        yield counter
