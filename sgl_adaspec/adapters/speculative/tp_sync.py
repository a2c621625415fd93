"""Under tensor parallelism, rank 0 decides and the other ranks of its group follow.

With `--tp N` every rank runs its own scheduler and its own copy of the policy, but the policies
read wall-clock time (iteration latencies, each request's decoding time, A(r)), which differs
between ranks. Two ranks deciding on their own could draft at different shapes or verify
different nodes inside one all-reduced forward pass: wrong tokens, or a hang. So every decision
that reaches a forward pass or a batch is taken on the group's rank 0 and broadcast, the
pattern of SGLang 0.5.23's `speculative/spec_tp_sync.py` on the same group
(`get_dp_tp_group()`: one data-parallel replica's TP ranks):
- the draft shape of each iteration (`hooks.forward_batch_generation`);
- which nodes each request verifies (`hooks.verify`);
- the admission order of the waiting queue and the prefill token limits
  (`adapters.scheduler`).
Only rank 0 observes outcomes, so statistics and metrics are counted once. Every rank calls
the same broadcasts in the same order: the branches around them depend only on what all ranks
share (the batch, the flags), never on a rank's own clock or policy state.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

# Test-only: per-rank clock rates ("1,5": rank 1's plugin clock runs 5x fast), so ranks would
# decide differently without the broadcasts.
CLOCK_RATES_ENV = "ADASPEC_TEST_RANK_CLOCK_RATES"


@dataclass(frozen=True)
class TpSync:
    """The TP group of this scheduler (None: one rank, nothing to broadcast)."""

    group: Any = None

    @property
    def rank(self) -> int:
        return 0 if self.group is None else self.group.rank_in_group

    @property
    def leads(self) -> bool:
        """This rank decides (rank 0 of its group, or the only rank)."""
        return self.rank == 0

    @property
    def size(self) -> int:
        return 1 if self.group is None else self.group.world_size

    def value(self, value: Any) -> Any:
        """Rank 0's `value` (a small picklable object) on every rank."""
        if self.size == 1:
            return value
        return self.group.broadcast_object(value if self.leads else None, src=0)

    def mask(self, mask: torch.Tensor | None, shape: tuple[int, ...], device) -> torch.Tensor:
        """Rank 0's bool `mask` of `shape` on every rank (the others pass None), broadcast on
        the group's device group like SGLang's own speculative decisions."""
        if self.size == 1:
            return mask
        wire = (
            mask.to(device=device, dtype=torch.uint8)
            if self.leads
            else torch.empty(shape, dtype=torch.uint8, device=device)
        )
        self.group.broadcast(wire, src=0)
        return wire.bool()


def tp_sync_of_scheduler() -> TpSync:
    """This scheduler's TP group (SGLang's `get_dp_tp_group`; None when it has one rank)."""
    from sglang.srt.layers.dp_attention import get_dp_tp_group

    group = get_dp_tp_group()
    return TpSync(group if group.world_size > 1 else None)


def clock_rate(sync: TpSync) -> float:
    """The test-only clock rate of this rank (1.0 unless `CLOCK_RATES_ENV` says otherwise)."""
    rates = os.environ.get(CLOCK_RATES_ENV)
    if not rates:
        return 1.0
    values = [float(v) for v in rates.split(",")]
    return values[sync.rank] if sync.rank < len(values) else 1.0
