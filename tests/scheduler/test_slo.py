"""SLO batch view: A(r), A_cap(r) and slack on hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from sgl_adaspec.scheduler.slo import SloBatch, capped_required, lead_weight, required_tokens

NAN, INF = math.nan, math.inf


def batch(tpot, elapsed, out) -> SloBatch:
    return SloBatch(
        torch.tensor(tpot, dtype=torch.float64),
        torch.tensor(elapsed, dtype=torch.float64),
        torch.tensor(out, dtype=torch.int64),
    )


def test_required_tokens_hand_values():
    slo = batch([50.0, 20.0, 50.0, NAN, INF], [1000.0, 1000.0, 1000.0, 500.0, 500.0],
                [18, 40, 20, 10, 10])
    required = required_tokens(slo, t_spec_ms=60.0)
    # (1000 + 60) / 50 - 18 = 3.2 ; (1000 + 60) / 20 - 40 = 13 ; 1060 / 50 - 20 = 1.2 ;
    # best effort (NaN or inf SLO) -> 0.
    assert required.tolist() == pytest.approx([3.2, 13.0, 1.2, 0.0, 0.0])
    assert slo.has_slo.tolist() == [True, True, True, False, False]


def test_on_track_request_needs_one_iteration_worth():
    # l = t * o exactly: on track; A = t_spec / t, here one TPOT worth of time -> 1 token, which
    # the bonus token alone provides.
    slo = batch([50.0], [1000.0], [20])
    assert required_tokens(slo, 50.0).tolist() == [1.0]
    # Far ahead of its track: negative.
    assert required_tokens(batch([50.0], [100.0], [20]), 50.0).tolist() == [-17.0]


def test_first_iteration():
    # Nothing decoded yet: A = t_spec / t.
    assert required_tokens(batch([25.0], [0.0], [0]), 100.0).tolist() == [4.0]


def test_slack():
    slo = batch([50.0, 20.0, NAN], [1000.0, 700.0, 10.0], [18, 40, 3])
    assert slo.slack_ms.tolist() == [-100.0, 100.0, INF]


def test_capped_required():
    required = torch.tensor([3.2, 13.0, 0.0, -1.0], dtype=torch.float64)
    assert capped_required(required, 3).tolist() == pytest.approx([3.2, 4.0, 0.0, -1.0])
    depth = torch.tensor([1, 8, 0, 2])
    assert capped_required(required, depth).tolist() == pytest.approx([2.0, 9.0, 0.0, -1.0])
    with pytest.raises(ValueError, match="depth must be >= 0"):
        capped_required(required, -1)
    with pytest.raises(ValueError, match="shape"):
        capped_required(required, torch.tensor([1, 2]))


@pytest.mark.parametrize(
    "tpot, elapsed, out, message",
    [
        ([0.0], [1.0], [1], "tpot_slo_ms must be > 0"),
        ([-5.0], [1.0], [1], "tpot_slo_ms must be > 0"),
        ([-INF], [1.0], [1], "tpot_slo_ms must be > 0"),
        ([50.0], [-1.0], [1], "decode_elapsed_ms"),
        ([50.0], [NAN], [1], "decode_elapsed_ms"),
        ([50.0], [1.0], [-1], "tokens_out"),
        ([50.0, 20.0], [1.0], [1], "every field must be"),
    ],
)
def test_slo_batch_rejects(tpot, elapsed, out, message):
    with pytest.raises(ValueError, match=message):
        batch(tpot, elapsed, out)


def test_slo_batch_rejects_integer_times():
    with pytest.raises(TypeError, match="floating"):
        SloBatch(torch.tensor([50]), torch.tensor([1.0]), torch.tensor([1]))


@pytest.mark.parametrize("t_spec", [-1.0, NAN, INF])
def test_required_tokens_rejects_bad_t_spec(t_spec):
    with pytest.raises(ValueError, match="t_spec_ms"):
        required_tokens(batch([50.0], [1.0], [1]), t_spec)


def test_lead_weight_hand_values():
    # TPOT so far over SLO q = elapsed / (out x SLO): 0.9, 0.5, 1.5 (behind), before the first
    # decoded token (1), best effort.
    slo = batch([50.0, 50.0, 50.0, 50.0, NAN], [900.0, 500.0, 1500.0, 30.0, 700.0],
                [20, 20, 20, 0, 10])
    assert slo.tpot_ratio[:4].tolist() == pytest.approx([0.9, 0.5, 1.5, 1.0])
    weight = lead_weight(slo, scale=0.3, floor=0.5)
    # exp(-(ln 0.9 / 0.3)^2 / 2) = exp(-0.06167) = 0.94019; q = 0.5 gives exp(-2.669) =
    # 0.06931, floored at 0.5; on or behind the line and best effort: 1.
    assert weight.tolist() == pytest.approx([0.94019, 0.5, 1.0, 1.0, 1.0], abs=1e-5)
    assert lead_weight(slo, scale=0.3, floor=0.01)[1].item() == pytest.approx(0.06931, abs=1e-5)
    with pytest.raises(ValueError, match="scale"):
        lead_weight(slo, scale=0.0, floor=0.5)
    for floor in (0.0, 1.5):
        with pytest.raises(ValueError, match="floor"):
            lead_weight(slo, scale=0.3, floor=floor)
