"""The pure parts of the acceptance calibration (sim/calibration/) on hand-made data, and the
committed calibration files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sgl_adaspec.sim import calibration as cal
from sgl_adaspec.sim.acceptance import (
    CALIBRATED_QWEN25CODER,
    DEFAULT,
    SYNTHETIC_DEFAULT,
    AcceptanceModel,
    resolve,
)


def test_bin_index_uses_left_closed_bins_and_puts_one_in_the_last():
    edges = (0.0, 0.1, 0.5, 1.0)
    got = cal.bin_index(np.array([0.0, 0.0999, 0.1, 0.49, 0.5, 0.999, 1.0]), edges)
    assert got.tolist() == [0, 0, 1, 1, 2, 2, 2]
    assert cal.bin_index(np.array([1.0])).tolist() == [len(cal.BIN_EDGES) - 2]


def test_bins_count_rate_brier_and_ece():
    bins = cal.Bins.empty()
    p = np.array([0.005, 0.005, 0.3, 0.35, 0.995, 0.995, 0.995, 0.995])
    y = np.array([0, 0, 1, 0, 1, 1, 1, 0])
    bins.add(p, y)
    mean_p, rate, n = bins.points()
    assert n.tolist() == [2, 2, 4]
    assert mean_p == pytest.approx([0.005, 0.325, 0.995])
    assert rate.tolist() == [0.0, 0.5, 0.75]
    assert bins.brier() == pytest.approx(np.mean((p - y) ** 2))
    expected_ece = (2 * 0.005 + 2 * abs(0.5 - 0.325) + 4 * abs(0.75 - 0.995)) / 8
    assert bins.ece() == pytest.approx(expected_ece)
    identity = (np.array([0.0, 1.0]), np.array([0.0, 1.0]))
    assert bins.ece(identity) == pytest.approx(expected_ece)
    both = bins + bins
    assert both.count.sum() == 16 and both.brier() == pytest.approx(bins.brier())
    assert cal.Bins.from_json(json.loads(json.dumps(bins.to_json()))).count.tolist() == (
        bins.count.tolist()
    )


def test_moments_merge_like_numpy():
    rng = np.random.default_rng(0)
    a, b = rng.random(7), rng.random(13)
    m = cal.Moments()
    m.add(a)
    m.add(np.array([]))
    m.add(b)
    both = np.concatenate([a, b])
    assert m.count == 20
    assert m.mean == pytest.approx(both.mean())
    assert m.var == pytest.approx(both.var())


def test_beta_from_moments_recovers_known_parameters():
    a, b = 2.0, 3.0
    mean = a / (a + b)
    var = a * b / ((a + b) ** 2 * (a + b + 1))
    fit = cal.beta_from_moments(mean, var)
    assert (fit.alpha, fit.beta) == pytest.approx((a, b))
    u_shaped = cal.beta_from_moments(0.9, 0.05)  # mass near 1, as a confident draft's top-1
    assert u_shaped.mean == pytest.approx(0.9) and u_shaped.beta < 1
    for bad in [(0.5, 0.25), (0.5, 0.0), (1.0, 0.01), (0.0, 0.01)]:
        with pytest.raises(ValueError):
            cal.beta_from_moments(*bad)


def test_isotonic_pools_adjacent_violators_by_weight():
    assert cal.isotonic(np.array([1, 3, 2, 4.0]), np.ones(4)).tolist() == [1, 2.5, 2.5, 4]
    assert cal.isotonic(np.array([3.0, 1.0]), np.array([1.0, 3.0])).tolist() == [1.5, 1.5]
    assert cal.isotonic(np.array([0.1, 0.2, 0.3]), np.ones(3)).tolist() == [0.1, 0.2, 0.3]
    fitted = cal.isotonic(np.array([0.5, 0.4, 0.3, 0.9, 0.2]), np.array([1, 1, 1, 1, 3.0]))
    assert (np.diff(fitted) >= 0).all()
    assert (fitted * [1, 1, 1, 1, 3]).sum() == pytest.approx(0.5 + 0.4 + 0.3 + 0.9 + 0.6)


def test_calibration_curve_is_monotone_from_zero_to_one_and_loads():
    bins = cal.Bins.empty()
    # An over-confident draft with one noisy bin: acceptance 0.9 at p ~ 0.35.
    bins.add(np.full(10, 0.005), np.zeros(10))
    bins.add(np.full(10, 0.35), np.r_[np.ones(9), 0])
    bins.add(np.full(10, 0.65), np.r_[np.ones(5), np.zeros(5)])
    bins.add(np.full(10, 0.995), np.r_[np.ones(8), np.zeros(2)])
    xs, ys = cal.calibration_curve(bins)
    assert xs[0] == 0.0 and xs[-1] == 1.0 and ys[0] == 0.0
    assert xs[1:-1] == pytest.approx((0.005, 0.35, 0.65, 0.995))
    assert ys[1:] == pytest.approx((0.0, 0.7, 0.7, 0.8, 0.8))
    model = SYNTHETIC_DEFAULT.with_calibration("fitted", xs, ys)
    assert model.calibrate(np.array([0.5]))[0] == pytest.approx(0.7)


def test_chain_depths_and_paths():
    ok = np.array([1, 1, 0, 1, 1, 1], dtype=bool)
    assert cal.chain_depths(ok, cap=2).tolist() == [2, 1, 0, 2, 2]
    assert cal.chain_depths(ok[:1], cap=2).tolist() == []
    depth, f, acc = cal.chain_paths(np.array([0.5, 0.4, 0.9]), np.array([1, 0, 1], bool), cap=2)
    assert depth.tolist() == [1, 1, 1, 2, 2]
    assert f == pytest.approx([0.5, 0.4, 0.9, 0.2, 0.36])
    assert acc.tolist() == [True, False, True, False, False]


def _hand_made_stats() -> dict[str, cal.ClassAcceptance]:
    rng = np.random.default_rng(3)
    classes = {}
    for name, quality in (("coding", 0.9), ("chat", 0.6), ("summarization", 0.7)):
        stats = cal.ClassAcceptance()
        for _ in range(5):
            top1 = np.clip(rng.beta(quality * 4, (1 - quality) * 4, size=40), 0.02, 0.999)
            rest = (1 - top1)[:, None] * np.array([0.5, 0.25, 0.125])
            top_p = np.concatenate([top1[:, None], rest], axis=1)
            u = rng.random(40)
            rank = np.where(u < top1, 0, np.where(u < top1 + rest[:, 0], 1, -1))
            stats.add(top_p, rank)
        classes[name] = stats
    return classes


def test_class_stats_fit_and_json_round_trip(tmp_path):
    classes = _hand_made_stats()
    coding = classes["coding"]
    assert coding.prompts == 5 and coding.positions == 200
    assert coding.node[0].count.sum() == 200 and coding.top1.count == 200
    assert sum(coding.chain_hist) == 5 * (40 - cal.CHAIN_CAP + 1)
    assert coding.chain_accept_mean(1) == pytest.approx(
        coding.chain_hist[1:].sum() / coding.chain_hist.sum()
    )
    provenance = {"target": {"name": "t"}, "draft": {"name": "d"}, "dtype": "bfloat16",
                  "date": "2026-11-22"}  # fmt: skip
    data = json.loads(json.dumps(cal.stats_to_json(classes, provenance)))
    again, prov = cal.stats_from_json(data)
    assert prov == provenance and list(again) == list(classes)
    for name in classes:
        assert again[name].to_json() == classes[name].to_json()
    model = cal.fit_model(again, "hand-made", cal.model_source(prov, again))
    assert set(model.top1) == {"coding", "chat", "summarization"}
    assert model.top1["coding"].mean == pytest.approx(classes["coding"].top1.mean, rel=1e-4)
    assert (np.diff(model.calibration_accept) >= 0).all()
    path = tmp_path / "model.json"
    path.write_text(json.dumps(model.to_json()))
    assert AcceptanceModel.load(path) == model
    ev = cal.evaluation(again, model)
    assert ev["coding"]["greedy_agreement"] > ev["chat"]["greedy_agreement"]


def test_fit_command_rebuilds_the_model_from_the_stats(tmp_path, capsys):
    classes = _hand_made_stats()
    provenance = {"target": {"name": "t"}, "draft": {"name": "d"}, "dtype": "bfloat16",
                  "date": "2026-11-22"}  # fmt: skip
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps(cal.stats_to_json(classes, provenance)))
    model_path = tmp_path / "model.json"
    assert cal.main(["fit", "--stats", str(stats), "--model", str(model_path),
                     "--figure", str(tmp_path / "fig.png")]) == 0  # fmt: skip
    model = AcceptanceModel.load(model_path)
    assert model.name == cal.MODEL_NAME
    assert "top1 mean/std" in capsys.readouterr().out


def test_committed_model_is_the_fit_of_the_committed_stats():
    classes, provenance = cal.stats_from_json(json.loads(cal.STATS_PATH.read_text()))
    assert set(classes) == {"coding", "chat", "summarization"}
    refit = cal.fit_model(classes, cal.MODEL_NAME, cal.model_source(provenance, classes))
    assert AcceptanceModel.load(cal.MODEL_PATH) == refit == CALIBRATED_QWEN25CODER
    for sha in (provenance["target"]["sha256"], provenance["draft"]["sha256"]):
        assert len(sha) == 64


def test_default_is_the_calibrated_model_and_names_resolve(tmp_path):
    assert DEFAULT is CALIBRATED_QWEN25CODER
    assert DEFAULT.source.startswith("measured")
    assert resolve(None) is DEFAULT
    assert resolve("synthetic-default") is SYNTHETIC_DEFAULT
    assert resolve(cal.MODEL_NAME) is CALIBRATED_QWEN25CODER
    path = tmp_path / "m.json"
    path.write_text(json.dumps(SYNTHETIC_DEFAULT.to_json()))
    assert resolve(str(path)) == SYNTHETIC_DEFAULT
