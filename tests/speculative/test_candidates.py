"""Candidate trees: node depths and accepted-path masks on hand-built trees, and the gain
table's chunked computation against one call for every pool."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from sgl_adaspec.sim.acceptance import resolve
from sgl_adaspec.sim.trees import draft_trees
from sgl_adaspec.speculative.adaserve import gain_table
from sgl_adaspec.speculative.adaserve.gain_table import ShapeGain
from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.shapes import beams_of_widths, restrict_to_shape


def tree(parents: list[list[int]], valid: list[list[bool]] | None = None) -> Candidates:
    rows, nodes = len(parents), len(parents[0]) if parents else 0
    probs = []
    for row in parents:  # f halves at each level: never above the parent's
        f: list[float] = []
        for parent in row:
            f.append(0.5 if parent < 0 else f[parent] / 2)
        probs.append(f)
    return Candidates(
        tokens=torch.zeros(rows, nodes, dtype=torch.int64),
        parents=torch.tensor(parents, dtype=torch.int64).view(rows, nodes),
        path_prob=torch.tensor(probs, dtype=torch.float64).view(rows, nodes),
        valid=torch.ones(rows, nodes, dtype=torch.bool) if valid is None else torch.tensor(valid),
    )  # fmt: skip


def test_depth_counts_levels_below_the_root():
    # Request 0: a chain 0 <- 1 <- 2 and a second child of the root (3) with a child (4).
    # Request 1: a 2-wide beam of two levels and a padding node (its parent field: -1).
    cands = tree(
        [[-1, 0, 1, -1, 3], [-1, -1, 0, 1, -1]],
        [[True] * 5, [True, True, True, True, False]],
    )
    assert cands.depth.tolist() == [[1, 2, 3, 1, 2], [1, 1, 2, 2, 1]]
    assert cands.max_depth.tolist() == [3, 2]


def test_a_beam_s_layout_gives_the_depths_and_its_shape_needs_no_search():
    rng = np.random.default_rng(3)
    alpha, beta = np.full(5, 3.0), np.full(5, 1.5)
    for depth, width in ((1, 1), (3, 2), (4, 3)):
        beam = draft_trees(resolve(None), rng, alpha, beta, depth, width).candidates()
        assert beam.beam == (depth, width)
        walked = Candidates(beam.tokens, beam.parents, beam.path_prob, beam.valid)
        assert beam.depth.tolist() == walked.depth.tolist()
        for shape in ((depth, width), (depth + 1, width), (depth, width + 1)):
            assert restrict_to_shape(beam, *shape) is beam  # no beam search
            assert torch.equal(beams_of_widths(walked, shape[0], (shape[1],))[0], beam.valid)
        narrowed = restrict_to_shape(beam, depth, max(width - 1, 1))
        if width > 1:  # a narrower shape is searched, not skipped
            assert narrowed.valid.sum() < beam.valid.sum()
        assert beam.derived(valid=narrowed.valid).beam == (depth, width)
    with pytest.raises(ValueError, match="2 x 2 beam has 4 nodes"):
        Candidates.of_beam(
            *(t[:, :3] for t in (beam.tokens, beam.parents)),
            beam.path_prob[:, :3],
            beam.valid[:, :3],
            2,
            2,
        )


def test_depth_of_empty_trees():
    assert tree([[], []]).depth.shape == (2, 0)
    assert tree([]).depth.shape == (0, 0)


def test_path_mask_marks_a_node_and_its_ancestors():
    cands = tree([[-1, 0, 1, -1, 3], [-1, -1, 0, 1, -1]])
    mask = cands.path_mask(torch.tensor([2, 3]))
    assert mask.tolist() == [
        [True, True, True, False, False],
        [False, True, False, True, False],
    ]
    none = cands.path_mask(torch.tensor([-1, 0]))  # -1: nothing accepted
    assert none.tolist() == [[False] * 5, [True, False, False, False, False]]


def test_path_mask_agrees_with_a_walk_on_random_trees():
    rng = random.Random(7)
    for _ in range(20):
        rows, nodes = rng.randint(1, 6), rng.randint(1, 12)
        parents = [[rng.randint(-1, j - 1) for j in range(nodes)] for _ in range(rows)]
        cands = tree(parents)
        picks = [rng.randint(-1, nodes - 1) for _ in range(rows)]
        expected = torch.zeros(rows, nodes, dtype=torch.bool)
        for r, node in enumerate(picks):
            while node >= 0:
                expected[r, node] = True
                node = parents[r][node]
        assert torch.equal(cands.path_mask(torch.tensor(picks)), expected)
        depth = cands.depth
        for r in range(rows):
            for j in range(nodes):
                parent = parents[r][j]
                assert depth[r, j] == (1 if parent < 0 else depth[r, parent] + 1)


@pytest.mark.parametrize("chunk_nodes", [1, 50])
def test_gain_table_is_the_same_in_chunks(monkeypatch, chunk_nodes):
    """The gains of every kept draft's SLO groups are computed in chunks of pools; any chunk
    size gives the table and group tables of one call for all of them, bit for bit."""

    def table(chunk: int) -> tuple[torch.Tensor, dict]:
        monkeypatch.setattr(gain_table, "GAIN_CHUNK_NODES", chunk)
        rng = random.Random(3)
        gain = ShapeGain(max_nodes=6, drafts=4)
        for draft in range(5):
            parents = [[-1, -1, 0, 1, 2, 3] for _ in range(4)]  # two chains of 3, interleaved
            probs = []
            for _ in range(4):
                row = [rng.uniform(0.05, 0.9), rng.uniform(0.05, 0.9)]
                for node in range(2, 6):
                    row.append(row[node - 2] * rng.uniform(0.3, 1.0))
                probs.append(row)
            cands = Candidates(
                tokens=torch.zeros(4, 6, dtype=torch.int64), parents=torch.tensor(parents),
                path_prob=torch.tensor(probs, dtype=torch.float64),
                valid=torch.ones(4, 6, dtype=torch.bool),
            )  # fmt: skip
            gain.observe(cands, 3, 2, groups=[20.0, 50.0, None, 20.0 if draft % 2 else 80.0])
            gain.refresh(lambda x: x * 0.9, fit=draft // 2)
        return gain.table, gain.groups

    whole_table, whole_groups = table(1 << 30)
    chunked_table, chunked_groups = table(chunk_nodes)
    assert torch.equal(whole_table, chunked_table)
    assert whole_groups.keys() == chunked_groups.keys() == {20.0, 50.0, 80.0}
    assert all(torch.equal(whole_groups[k], chunked_groups[k]) for k in whole_groups)
