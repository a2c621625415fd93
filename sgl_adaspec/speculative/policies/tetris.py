"""The tetris policy (TETRIS, seed 002): batch-wide choice of which draft chain tokens to verify.

Each request drafts a chain: its most probable path through the EAGLE tree (width 1), up to
k + extra tokens deep, where k = draft_depth - extra is its share of the verify capacity.
The capacity is C = B * k draft tokens per verify pass (plus the B roots, which are always
verified). TETRIS Algorithm 1 fills C with a heap that repeatedly extends the request whose
next chain token has the highest cumulative acceptance prod_{t<=j} p_{i,t} = f; since f never
increases along a chain, that equals the batch-wide top-C chain nodes by f, each request's
share being a prefix of its chain. So "easy" requests verify longer windows (up to k + extra)
and "hard" ones shorter (down to 0), at the same total cost as every request verifying k.

Pure (tensors and dataclasses, no SGLang), like `adaserve.py`. Dims and terms as in
`speculative/candidates.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sgl_adaspec.flags import ConfigError, check_flags, flag
from sgl_adaspec.scheduler.slo import SloBatch
from sgl_adaspec.speculative.policies.base import (
    Decision,
    IterationInput,
    PolicyBase,
    check_common_config,
    no_infeasible,
)
from sgl_adaspec.speculative.selection import select_adaserve
from sgl_adaspec.speculative.shapes import restrict_to_shape, selection_from_mask


@dataclass(frozen=True)
class TetrisConfig:
    """- extra: draft tokens per request beyond its capacity share k (`--tetris-extra`); the
      chain is drafted draft_depth = k + extra deep, so k = draft_depth - extra;
    - turn_on_batch_size: batch-wide selection only with at least this many running requests
      (`--tetris-turn-on-batch-size`); below it every request verifies its first k chain
      tokens (standard batched speculative decoding);
    - latency_smoothing: weight of the newest measurement in the latency moving averages;
    - baseline_tpot_ms: TPOT without speculation; None: estimated online (see `PolicyBase`)."""

    extra: int = flag(
        1,
        "tetris: draft tokens per request beyond its share of the verify capacity; the "
        "capacity is (--speculative-num-steps - K) tokens per request (default: %(default)s).",
        metavar="K",
        minimum=0,
    )
    turn_on_batch_size: int = flag(
        1,
        "tetris: batch-wide selection from this many running requests on; below it each "
        "request verifies its capacity share (default: %(default)s).",
        metavar="N",
        minimum=1,
    )
    latency_smoothing: float = 0.3
    baseline_tpot_ms: float | None = None

    def __post_init__(self) -> None:
        check_flags(self, "tetris")
        check_common_config(self.latency_smoothing, self.baseline_tpot_ms)

    def check_steps(self, steps: int) -> None:
        """The draft of `steps` steps must leave a capacity share k = steps - extra >= 1."""
        if steps <= self.extra:
            raise ConfigError(
                f"--tetris-extra {self.extra} leaves no verify capacity: it must be below "
                f"--speculative-num-steps ({steps})"
            )


@dataclass
class TetrisPolicy(PolicyBase):
    config: TetrisConfig = field(default_factory=TetrisConfig)

    def __post_init__(self) -> None:
        self.latency_smoothing = self.config.latency_smoothing
        self.baseline_tpot_ms_config = self.config.baseline_tpot_ms
        super().__post_init__()

    def capacity_share(self, draft_depth: int) -> int:
        """k: draft tokens per request the verify capacity holds (the rest of the chain is the
        `extra` TETRIS chooses from)."""
        self.config.check_steps(draft_depth)
        return draft_depth - self.config.extra

    def draft_widths(self, topk: int) -> list[int]:
        return [1]

    def draft_shape(
        self, num_requests: int, steps: int, topk: int, slo: SloBatch | None = None
    ) -> tuple[int, int]:
        """A chain policy reads only each request's most probable chain, which a width-1 beam
        drafts (the draft's argmax at every step) at 1 / topk of the draft rows."""
        return steps, 1

    def decide(self, it: IterationInput) -> Decision:
        num_requests = it.cands.num_requests
        share = self.capacity_share(it.draft_depth)
        chain_len = share + self.config.extra  # = draft_depth: how deep a chain may be verified
        capacity = num_requests * share  # C draft tokens, roots not included
        if num_requests >= self.config.turn_on_batch_size:
            # TETRIS Algorithm 1 as a batch-wide top-C over the chains' f (the heap always pops
            # a request's frontier; a global top-C by f with ties toward the lower request and
            # the shallower node pops the same set, as each chain's f is non-increasing).
            # select_adaserve with no SLO requirement is exactly that top-k; its budget
            # counts the roots, hence B + C.
            chains = restrict_to_shape(it.cands, chain_len, 1)
            required = torch.zeros(num_requests, dtype=torch.float64, device=chains.valid.device)
            selection = select_adaserve(chains, required, num_requests + capacity, 0)
            depth = chain_len
        else:
            # Too few requests for the reallocation to pay off: standard SD, k tokens each.
            selection = selection_from_mask(restrict_to_shape(it.cands, share, 1).valid)
            depth = share
        return Decision(selection, depth, 1, num_requests + capacity, no_infeasible(it))
