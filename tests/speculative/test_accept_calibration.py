"""The acceptance calibration (`accept_calibration`): f -> f' learned from verify outcomes."""

from __future__ import annotations

import pytest
import torch

from sgl_adaspec.speculative.accept_calibration import AcceptanceCalibration


def test_calibration_learns_an_overconfident_draft():
    calibration = AcceptanceCalibration(prior_weight=1.0)
    # A chain of two nodes with f = 0.8, 0.64; the target accepts the first half the time and
    # the second never.
    f = torch.tensor([[0.8, 0.64]])
    for i in range(200):
        calibration.observe(f, torch.tensor([[i % 2 == 0, False]]))
    assert calibration.apply(torch.tensor([0.8])).item() == pytest.approx(0.5, abs=0.03)
    assert calibration.apply(torch.tensor([0.64])).item() == pytest.approx(0.0, abs=0.03)
    assert calibration.apply(torch.tensor([0.0])).item() == 0.0
    # The sum it predicts for the verified nodes is what was accepted.
    assert calibration.calibrated_sum(f) == pytest.approx(0.5, abs=0.05)


def test_calibration_learns_an_underconfident_chain():
    """A chain always accepted whose draft gives each step 0.3: f = 0.3, 0.09, 0.027, 0.0081.
    Every depth maps to 1 (no single power or factor of f would do that)."""
    calibration = AcceptanceCalibration()
    chain = torch.tensor([[0.3, 0.09, 0.027, 0.0081]])
    for _ in range(300):
        calibration.observe(chain, torch.ones_like(chain, dtype=torch.bool))
    assert calibration.calibrated_sum(chain) == pytest.approx(4.0, rel=0.05)
    assert calibration.apply(chain).min().item() > 0.95


def test_calibration_map_never_decreases_in_f():
    calibration = AcceptanceCalibration(prior_weight=0.5)
    # Noisy and non-monotone evidence: f = 0.5 accepted more often than f = 0.7.
    for i in range(100):
        calibration.observe(torch.tensor([[0.7, 0.5]]), torch.tensor([[i % 4 == 0, i % 4 != 3]]))
    f = torch.linspace(0.0, 1.0, 101)
    g = calibration.apply(f)
    assert (g[1:] >= g[:-1] - 1e-12).all()
    assert 0.4 < calibration.apply(torch.tensor([0.6])).item() < 0.6  # 0.25 and 0.75 pooled


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_calibration_never_decreases_as_computed_so_no_parent_cap_is_needed(dtype):
    """The policy skips capping f' at the parent's (a walk to the root per node): it relies on
    g being non-decreasing bit for bit, rounding included, at and around every knot."""
    calibration = AcceptanceCalibration(prior_weight=0.3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        f = torch.rand(1, 24, generator=gen, dtype=torch.float64) ** 3
        calibration.observe(f, torch.rand(1, 24, generator=gen) < f.float() * 0.8 + 0.1)
    knots, *_ = calibration.fit()
    near = torch.cat(
        [knots + k * 1e-16 for k in range(-4, 5)]
        + [torch.rand(20_000, generator=gen, dtype=torch.float64)]
    )
    f = near.clamp(0.0, 1.0).to(dtype).sort().values
    g = calibration.apply(f)
    assert g.dtype == dtype and bool((g[1:] >= g[:-1]).all())  # exact: no tolerance
    assert calibration.apply(torch.zeros(3, dtype=dtype)).eq(0).all()


def test_one_weak_verify_does_not_zero_the_calibration():
    """A first verify of one request whose 32 nodes read f = 0.01 or so (0.32 in all) and are
    all rejected is what a calibrated draft does two times in three. Read as an overall error
    of 0, g was 0 at every f, no node was worth verifying, and no verify could show otherwise
    again. Now the error is pulled toward 1 and g above the bins seen follows it."""
    calibration = AcceptanceCalibration()
    calibration.observe(torch.full((1, 32), 0.01), torch.zeros((1, 32), dtype=torch.bool))
    high = calibration.apply(torch.tensor([0.9])).item()
    scale = (0 + 1.0) / (0.32 + 1.0)  # bias_prior = 1 pseudo-success and as much f
    assert high == pytest.approx(scale * (0.9 - 0.01) / (1 - 0.01) + 0.0, abs=0.01)
    assert calibration.apply(torch.tensor([0.01])).item() < 0.001  # 32 misses at f = 0.01
    # Evidence still wins: the same weak verify 300 times (decayed: ~16 of f, no success) reads
    # an error of 1 / 17 at every f.
    for _ in range(300):
        calibration.observe(torch.full((1, 32), 0.01), torch.zeros((1, 32), dtype=torch.bool))
    assert calibration.apply(torch.tensor([0.9])).item() == pytest.approx(0.9 / 17, abs=0.005)


def test_calibration_above_the_bins_seen_follows_the_overall_error():
    calibration = AcceptanceCalibration()
    # A draft accepted half as often as it says, seen at f = 0.2 only.
    f = torch.tensor([[0.2, 0.2, 0.2, 0.2, 0.2]])
    for i in range(400):
        calibration.observe(f, torch.tensor([[i % 2 == 0, False, False, False, False]]))
    assert calibration.apply(torch.tensor([0.2])).item() == pytest.approx(0.1, abs=0.01)
    # Linear from the last bin (0.2, 0.1) to (1, 0.5).
    assert calibration.apply(torch.tensor([0.6])).item() == pytest.approx(0.3, abs=0.01)
    g = calibration.apply(torch.linspace(0.0, 1.0, 101))
    assert (g[1:] >= g[:-1] - 1e-12).all()


def test_calibration_without_observations_is_the_identity():
    calibration = AcceptanceCalibration()
    f = torch.tensor([0.9, 0.2, 0.0])
    assert calibration.apply(f).tolist() == pytest.approx(f.tolist(), abs=0.02)
