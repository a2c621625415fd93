"""Per-request SLO progress as one vectorized batch view, and AdaServe's required progress A(r).

Terms (B = requests in the batch):
- TPOT SLO t_r: the target time per output token (ms) of request r; NaN or +inf means the
  request has no SLO (best effort).
- decoding latency l_r: ms elapsed since r's first token (the prefill's), as a client measures
  TPOT: a wait for r's first decode iteration counts.
- tokens out o_r: tokens r has committed since that first token (so that l_r / o_r is its TPOT
  so far; the token produced by prefill is not one of them).
- t_spec: the expected latency of the coming iteration (draft + verify).
- slack: how far ahead of its SLO track a request is, in ms (t_r * o_r - l_r; negative = late).

A request meets its SLO after this iteration when (l_r + t_spec) / (o_r + acc_r) <= t_r
(AdaServe eq. 2), i.e. when it accepts acc_r >= A(r) = (l_r + t_spec) / t_r - o_r tokens.
Here "accepted" counts everything the iteration commits, the bonus token included: the paper's
E[acc(T)] = sum of f over the tree T *with its root* (f(root) = 1 is the bonus token, and
Algorithm 2 starts n_acc at 1.0 for it), so A(r) <= 1 means the bonus token alone suffices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SloBatch:
    """SLO state of the B running requests. Fields:
    - tpot_slo_ms [B] float: t_r; NaN or +inf = best effort;
    - decode_elapsed_ms [B] float: l_r, >= 0;
    - tokens_out [B] (int or float): o_r, >= 0;
    - draft_blind [B] bool or None (none): requests prefilled without the draft, which gain
      nothing from speculation (`PolicyBase.draft_prefills`).
    """

    tpot_slo_ms: torch.Tensor
    decode_elapsed_ms: torch.Tensor
    tokens_out: torch.Tensor
    draft_blind: torch.Tensor | None = None

    def __post_init__(self) -> None:
        fields = {
            "tpot_slo_ms": self.tpot_slo_ms,
            "decode_elapsed_ms": self.decode_elapsed_ms,
            "tokens_out": self.tokens_out,
        }
        tpot_shape = self.tpot_slo_ms.shape
        for name, value in fields.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"SloBatch.{name} must be a torch.Tensor, got {type(value)}")
            if value.ndim != 1 or value.shape != self.tpot_slo_ms.shape:
                raise ValueError(
                    f"SloBatch.{name} has shape {tuple(value.shape)}; every field must be [B] "
                    f"with B = {self.tpot_slo_ms.shape[0] if self.tpot_slo_ms.ndim else '?'}"
                )
        blind = self.draft_blind
        if blind is not None and (blind.dtype != torch.bool or blind.shape != tpot_shape):
            raise ValueError(
                f"SloBatch.draft_blind must be [B] bool, got {blind.dtype} {tuple(blind.shape)}"
            )
        for name in ("tpot_slo_ms", "decode_elapsed_ms"):
            if not fields[name].is_floating_point():
                raise TypeError(f"SloBatch.{name} must be floating, got {fields[name].dtype}")
        tpot = self.tpot_slo_ms
        if bool((self.has_slo & ~(tpot > 0)).any()) or bool((tpot == -math.inf).any()):
            raise ValueError(f"SloBatch.tpot_slo_ms must be > 0 (or NaN/inf for none): {tpot}")
        elapsed = self.decode_elapsed_ms
        if not bool((torch.isfinite(elapsed) & (elapsed >= 0)).all()):
            raise ValueError(f"SloBatch.decode_elapsed_ms must be finite and >= 0: {elapsed}")
        out = self.tokens_out.double()
        if not bool((torch.isfinite(out) & (out >= 0)).all()):
            raise ValueError(f"SloBatch.tokens_out must be finite and >= 0: {self.tokens_out}")

    @property
    def num_requests(self) -> int:
        return self.tpot_slo_ms.shape[0]

    @property
    def has_slo(self) -> torch.Tensor:
        """[B] bool: the request has a finite TPOT SLO."""
        return torch.isfinite(self.tpot_slo_ms)

    @property
    def tpot_ratio(self) -> torch.Tensor:
        """[B] float64: q_r = l_r / (o_r t_r), r's TPOT so far over its SLO (1 before its first
        decoded token; NaN for best effort once it decoded)."""
        tokens = self.tokens_out.double()
        elapsed, tpot = self.decode_elapsed_ms.double(), self.tpot_slo_ms.double()
        return torch.where(tokens > 0, elapsed / (tokens.clamp(min=1.0) * tpot), 1.0)

    @property
    def slack_ms(self) -> torch.Tensor:
        """[B] float: t_r * o_r - l_r, ms ahead of the SLO track (negative = late; inf = none)."""
        ahead = self.tpot_slo_ms * self.tokens_out - self.decode_elapsed_ms
        return torch.where(self.has_slo, ahead, math.inf)


def required_tokens(slo: SloBatch, t_spec_ms: float) -> torch.Tensor:
    """A(r) [B] float: tokens r must commit this iteration (bonus included) to be on its SLO track.

    From (l_r + t_spec) / (o_r + A) = t_r: A(r) = (l_r + t_spec) / t_r - o_r. It may be <= 1
    (the bonus token alone suffices) or negative (r is ahead). Best-effort requests get 0: they
    need nothing, and they sort after every request that is behind.
    """
    if not (math.isfinite(t_spec_ms) and t_spec_ms >= 0):
        raise ValueError(f"t_spec_ms must be finite and >= 0, got {t_spec_ms}")
    has_slo = slo.has_slo  # [B]
    tpot = torch.where(has_slo, slo.tpot_slo_ms, 1.0)  # [B], no division by NaN/inf
    required = (slo.decode_elapsed_ms + t_spec_ms) / tpot - slo.tokens_out  # [B]
    return torch.where(has_slo, required, 0.0)


def lead_weight(slo: SloBatch, scale: float, floor: float) -> torch.Tensor:
    """[B] float64 in [floor, 1]: what one more expected token of each request is worth to
    attainment, relative to a request on its SLO line (a rank weight of `select_adaserve`,
    which needs it > 0). A request whose TPOT so far is well
    under its SLO (q = `tpot_ratio` < 1) meets it with or without the token, one on its line
    may not: exp(-(ln q)^2 / (2 scale^2)), floored so that speed still reaches requests far
    ahead (it drains the batch). 1 on or behind the line and for best effort."""
    if not (scale > 0 and 0.0 < floor <= 1.0):
        raise ValueError(f"lead_weight needs scale > 0 and 0 < floor <= 1, got {scale}, {floor}")
    ratio = slo.tpot_ratio
    weight = torch.exp(-0.5 * (torch.log(ratio.clamp(min=1e-9)) / scale) ** 2).clamp(min=floor)
    return torch.where(slo.has_slo & (ratio < 1.0), weight, 1.0)


def capped_required(required: torch.Tensor, depth: torch.Tensor | int) -> torch.Tensor:
    """A_cap(r) = min(A(r), d + 1) [B]: the most a depth-d tree can deliver in one iteration.

    A verified path holds at most d draft tokens, and the bonus token comes on top, so at most
    d + 1 tokens are committed; asking for more cannot be met this iteration (AdaServe 4.3,
    "Step 2"). The +1 is the bonus token, in the same units as A(r) and n_acc (which starts
    at 1). `depth` is an int or [B] (per-request tree depth: a tree's, `Candidates.max_depth`,
    so never negative and not read back to check).
    """
    if isinstance(depth, int):
        if depth < 0:
            raise ValueError(f"depth must be >= 0, got {depth}")
        return required.clamp(max=float(depth + 1))
    if depth.shape != required.shape:
        raise ValueError(f"depth has shape {tuple(depth.shape)}, required {tuple(required.shape)}")
    return torch.minimum(required, depth + 1)  # promoted to required's dtype, exactly
