"""Acceptance model, sampled draft trees and the accept walk."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from sgl_adaspec.sim.acceptance import SYNTHETIC_DEFAULT, AcceptanceModel, zero_acceptance
from sgl_adaspec.sim.trees import accept_walk, draft_trees
from sgl_adaspec.speculative.selection import expected_accepted, select_static


def _trees(model, classes, depth, width, seed=0):
    alpha, beta = model.class_params(classes)
    return draft_trees(model, np.random.default_rng(seed), alpha, beta, depth, width)


def test_json_round_trip(tmp_path):
    path = tmp_path / "acc.json"
    path.write_text(json.dumps(SYNTHETIC_DEFAULT.to_json()))
    assert AcceptanceModel.load(path) == SYNTHETIC_DEFAULT
    path.write_text(json.dumps({"name": "x", "source": "y", "top1": {}, "calibration": {}}))
    with pytest.raises(ValueError, match=str(path)):
        AcceptanceModel.load(path)


def test_calibration_must_span_zero_to_one():
    with pytest.raises(ValueError):
        SYNTHETIC_DEFAULT.with_calibration("bad", (0.2, 1.0), (0.0, 1.0))


@pytest.mark.parametrize("depth,width", [(1, 1), (5, 1), (3, 4), (8, 4)])
def test_beam_search_builds_valid_trees_of_the_requested_shape(depth, width):
    trees = _trees(SYNTHETIC_DEFAULT, ["coding", "chat", "summarization"] * 3, depth, width)
    cands = trees.candidates()  # validates parents and monotone f
    assert cands.num_nodes == depth * width
    assert cands.max_depth.tolist() == [depth] * 9
    level = cands.depth[0].view(depth, width)
    assert (level == torch.arange(1, depth + 1)[:, None]).all()


@pytest.mark.parametrize("depth,width,keep", [(5, 1, 5), (4, 3, 12), (5, 4, 7)])
def test_calibrated_walk_accepts_the_expected_number(depth, width, keep):
    """With the identity calibration P(path accepted) = f, so the mean accepted drafts equal
    E[acc] - 1 = sum of f over the selected nodes (AdaServe Theorem 3.1)."""
    trees = _trees(SYNTHETIC_DEFAULT, ["chat"] * 20_000, depth, width)
    cands = trees.candidates()
    selection = select_static(cands, keep)
    walked, _ = accept_walk(trees, selection.mask.numpy(), np.random.default_rng(1))
    expected = float(expected_accepted(cands, selection.mask).mean()) - 1
    assert walked.mean() == pytest.approx(expected, abs=0.03)
    assert (walked <= selection.counts.numpy()).all()


def test_walk_accepts_only_selected_nodes():
    trees = _trees(SYNTHETIC_DEFAULT, ["coding"] * 500, 4, 2)
    rng = np.random.default_rng(0)
    none = np.zeros(trees.parents.shape, dtype=bool)
    assert accept_walk(trees, none, rng)[0].max() == 0
    first_level = none.copy()
    first_level[:, :2] = True
    assert accept_walk(trees, first_level, rng)[0].max() == 1


def test_zero_acceptance_never_accepts():
    model = zero_acceptance()
    trees = _trees(model, ["coding"] * 200, 5, 4)
    selected = np.ones(trees.parents.shape, dtype=bool)
    assert accept_walk(trees, selected, np.random.default_rng(0))[0].max() == 0


def test_coding_drafts_are_accepted_more_than_chat():
    model = SYNTHETIC_DEFAULT
    means = {}
    for name in ("coding", "chat", "summarization"):
        trees = _trees(model, [name] * 5000, 5, 1)
        selected = np.ones(trees.parents.shape, dtype=bool)
        means[name] = accept_walk(trees, selected, np.random.default_rng(2))[0].mean()
    assert means["coding"] > means["chat"] > 0
    assert means["coding"] > means["summarization"] > 0
