"""SGLang's `sampling.renorm` on CPU: top-k and top-p renormalization with FlashInfer's
semantics, for the sampling verify."""

from __future__ import annotations

import torch


def _per_row(value, batch_size: int, dtype: torch.dtype, device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        value = value.to(device=device, dtype=dtype).reshape(-1)
        return value.expand(batch_size) if value.numel() == 1 else value
    return torch.full((batch_size,), value, dtype=dtype, device=device)


def _renorm_at_pivots(probs: torch.Tensor, pivots: torch.Tensor) -> torch.Tensor:
    """Keep every probability >= its row's pivot (ties at the pivot included), renormalize."""
    kept = torch.where(probs >= pivots.unsqueeze(1), probs, 0.0)
    return kept / kept.sum(dim=1, keepdim=True)


def top_k_renorm_prob(probs: torch.Tensor, top_k) -> torch.Tensor:
    """Stands in for `sampling.renorm.top_k_renorm_prob` (FlashInfer semantics): probs [N, V]
    -> the k largest of each row (all ties at the k-th value kept), renormalized, float32."""
    probs = probs.float()
    batch_size, vocab_size = probs.shape
    top_ks = _per_row(top_k, batch_size, torch.int64, probs.device)
    ordered = torch.sort(probs, dim=1, descending=True).values
    cutoff = (top_ks - 1).clamp(min=0, max=vocab_size - 1)
    return _renorm_at_pivots(probs, ordered.gather(1, cutoff.unsqueeze(1)).squeeze(1))


def top_p_renorm_prob(probs: torch.Tensor, top_p) -> torch.Tensor:
    """Stands in for `sampling.renorm.top_p_renorm_prob` (FlashInfer semantics): drop the
    lowest-probability tokens whose total mass stays below 1 - p, keep ties at the pivot,
    renormalize. probs [N, V] -> float32 [N, V]."""
    probs = probs.float()
    batch_size, vocab_size = probs.shape
    top_ps = _per_row(top_p, batch_size, torch.float32, probs.device)
    ascending = torch.sort(probs, dim=1).values
    cdf = torch.cumsum(ascending, dim=1)
    cutoff = torch.searchsorted(cdf, (1.0 - top_ps).unsqueeze(1), right=False).squeeze(1)
    cutoff = cutoff.clamp(max=vocab_size - 1)
    return _renorm_at_pivots(probs, ascending.gather(1, cutoff.unsqueeze(1)).squeeze(1))
