"""Top-k / top-p renormalization on CPU (FlashInfer's pivot semantics: ties kept)."""

from __future__ import annotations

import torch

from sgl_adaspec.adapters.platform.cpu.renorm import top_k_renorm_prob, top_p_renorm_prob

PROBS = torch.tensor([[0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]])


def test_top_k_keeps_the_k_largest_and_ties():
    out = top_k_renorm_prob(PROBS, torch.tensor([2, 1]))
    assert torch.allclose(out[0], torch.tensor([0.4, 0.3, 0.0, 0.0]) / 0.7)
    assert torch.allclose(out[1], torch.full((4,), 0.25))  # all tied with the 1st: all kept


def test_top_p_keeps_the_smallest_head_with_mass_p():
    out = top_p_renorm_prob(PROBS[:1], 0.65)  # 0.4 + 0.3 >= 0.65; drop 0.1 and 0.2 (0.3 < 0.35)
    assert torch.allclose(out[0], torch.tensor([0.4, 0.3, 0.0, 0.0]) / 0.7)
    assert torch.allclose(top_p_renorm_prob(PROBS[:1], 1.0), PROBS[:1])


def test_scalar_and_per_row_arguments_agree():
    assert torch.equal(top_k_renorm_prob(PROBS, 3), top_k_renorm_prob(PROBS, torch.tensor([3, 3])))
