"""Budget from the verify cost curve: the knee where cost starts to rise."""

from __future__ import annotations

import pytest

from sgl_adaspec.scheduler.cost_model import VerifyCostProfile, knee_budget


def test_flat_then_linear_curve_has_its_knee_at_the_corner():
    tokens = (8, 16, 32, 64, 128, 256, 512)
    latency = (10.0, 10.1, 10.2, 10.4, 20.0, 40.0, 80.0)  # flat until 64, linear after
    assert knee_budget(VerifyCostProfile(tokens, latency)) == 64


def test_concave_or_linear_curve_takes_the_largest_count():
    tokens = (1, 8, 16, 64)
    assert knee_budget(VerifyCostProfile(tokens, (53.0, 98.0, 168.0, 250.0))) == 64
    assert knee_budget(VerifyCostProfile(tokens, (1.0, 8.0, 16.0, 64.0))) == 64


def test_flat_curve_takes_the_largest_count():
    assert knee_budget(VerifyCostProfile((4, 8, 12), (5.0, 5.0, 5.0))) == 12


@pytest.mark.parametrize(
    ("tokens", "latency"),
    [((8,), (1.0,)), ((8, 4), (1.0, 2.0)), ((0, 4), (1.0, 2.0)), ((4, 8), (1.0, 0.0))],
)
def test_bad_profiles_are_rejected(tokens, latency):
    with pytest.raises(ValueError):
        VerifyCostProfile(tokens, latency)


def test_marginal_cost_per_token():
    from sgl_adaspec.scheduler.cost_model import marginal_ms_per_token

    assert marginal_ms_per_token(VerifyCostProfile((8, 64), (10.0, 38.0))) == 0.5
    assert marginal_ms_per_token(VerifyCostProfile((8, 64), (10.0, 9.0))) == 0.0
