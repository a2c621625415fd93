"""adaserve's gain table (`adaserve.gain_table.ShapeGain`, `pooled_gain`) on hand-computed
drafts."""

from __future__ import annotations

import pytest
import torch
from adaserve_inputs import beam

from sgl_adaspec.speculative.adaserve.gain_table import ShapeGain, pooled_gain


def test_shape_gain_reads_every_smaller_shape_from_one_draft():
    # One request, a 2 x 2 beam: level 1 f = .8, .1; level 2 f = .6 (under .8), .05 (under .1).
    gain = ShapeGain(max_nodes=4)
    gain.observe(beam([[[0.8, 0.1], [0.6, 0.05]]]), 2, 2)
    gain.refresh(lambda f: f)
    assert gain.curve(1, 1).tolist() == pytest.approx([0, 0.8, 0.8, 0.8, 0.8])
    assert gain.curve(2, 1).tolist() == pytest.approx([0, 0.8, 1.4, 1.4, 1.4])  # the chain
    assert gain.curve(1, 2).tolist() == pytest.approx([0, 0.8, 0.9, 0.9, 0.9])
    assert gain.curve(2, 2).tolist() == pytest.approx([0, 0.8, 1.4, 1.5, 1.55])
    gain.refresh(lambda f: f.sqrt())  # a new calibration re-reads the kept draft
    assert gain.curve(2, 1)[2].item() == pytest.approx(0.8**0.5 + 0.6**0.5)
    # A later, narrower draft updates only the shapes it reached.
    gain.observe(beam([[[0.2], [0.1]]]), 2, 1)
    gain.refresh(lambda f: f)
    assert gain.curve(2, 1)[2].item() == pytest.approx((1.4 + 0.3) / 2)
    assert gain.curve(2, 2)[4].item() == pytest.approx(1.55)
    assert gain.curve(2, 2) is not None and gain.curve(3, 1) is None


def test_shape_gain_tables_are_the_pooled_gain_of_every_node_count():
    # Four requests, a 3 x 2 beam each (f falls along every path), two SLO groups; the table
    # holds up to 16 nodes per request, more than any shape has: past a shape's nodes its
    # gain stays at what all of them give. A group's table is its requests' share of the
    # batch's 4 k best nodes, per request of the group.
    torch.manual_seed(0)
    levels = torch.rand(4, 3, 2, dtype=torch.float64).sort(dim=2, descending=True).values
    levels = levels.cumprod(dim=1)
    gain = ShapeGain(max_nodes=16)
    gain.observe(beam(levels.tolist()), 3, 2, [1.0, 1.0, 2.0, 2.0])
    gain.refresh(torch.sqrt)
    for s, (depth, width) in enumerate(gain.shapes):
        ranked = levels[:, :depth, :width].reshape(4, -1).sqrt().sort(descending=True).values
        ranked = torch.nn.functional.pad(ranked, (0, 16 - ranked.shape[1]))  # [4, 16]
        owner = torch.arange(4).unsqueeze(1).expand(-1, 16).flatten()
        order = ranked.flatten().sort(descending=True, stable=True).indices
        for table, rows in ((gain.table, [0, 1, 2, 3]), (gain.group_table(2.0), [2, 3])):
            mine = torch.isin(owner[order], torch.tensor(rows))
            best = torch.where(mine, ranked.flatten()[order], 0.0).cumsum(0)
            expected = best[torch.arange(1, 17) * 4 - 1] / len(rows)
            assert table[s, 1:].tolist() == pytest.approx(expected.tolist(), abs=1e-12)
            assert table[s, -1].item() == pytest.approx(float(ranked[rows].sum()) / len(rows))


def test_shape_gain_keeps_a_shape_the_kept_drafts_no_longer_reach():
    # Two drafts kept: a 2 x 2 one, then two 1 x 1 chains. The wide, deep shapes keep what the
    # first returned (else the plan could not choose them again until the next exploring
    # draft); the shapes the chains reached read the chains.
    gain = ShapeGain(max_nodes=4, drafts=2)
    gain.observe(beam([[[0.8, 0.1], [0.6, 0.05]]]), 2, 2)
    gain.refresh(lambda f: f)
    for _ in range(2):
        gain.observe(beam([[[0.4]]]), 1, 1)
        gain.refresh(lambda f: f)
    assert gain.curve(2, 2).tolist() == pytest.approx([0, 0.8, 1.4, 1.5, 1.55])
    assert gain.curve(2, 1).tolist() == pytest.approx([0, 0.8, 1.4, 1.4, 1.4])
    assert gain.curve(1, 1).tolist() == pytest.approx([0, 0.4, 0.4, 0.4, 0.4])


def test_shape_gain_reuses_a_drafts_gains_under_the_same_fit():
    """A refresh under a named fit computes only the drafts new since that fit; under a new
    fit (or none) every kept draft is recalibrated."""
    gain = ShapeGain(max_nodes=2)
    gain.observe(beam([[[0.8]]]), 1, 1)
    gain.refresh(lambda f: f, fit=1)
    assert gain.curve(1, 1).tolist() == pytest.approx([0, 0.8, 0.8])
    gain.observe(beam([[[0.4]]]), 1, 1)
    gain.refresh(lambda f: f / 2, fit=1)  # the first draft keeps its gains: 0.8, the new 0.2
    assert gain.curve(1, 1).tolist() == pytest.approx([0, 0.5, 0.5])
    gain.refresh(lambda f: f / 2, fit=2)  # both under the new fit: 0.4 and 0.2
    assert gain.curve(1, 1).tolist() == pytest.approx([0, 0.3, 0.3])
    gain.refresh(lambda f: f)  # unnamed: recomputed
    assert gain.curve(1, 1).tolist() == pytest.approx([0, 0.6, 0.6])


def test_shape_gain_keeps_a_bounded_sample_of_a_large_batch():
    """Past `max_rows` requests a draft is kept for an evenly spread sample of them, from an
    offset that turns draft by draft, so the table costs the same at any batch size."""
    gain = ShapeGain(max_nodes=1, max_rows=3)
    six = beam([[[0.1 * (r + 1)]] for r in range(6)])  # request r's one node: f = 0.1 (r + 1)
    gain.observe(six, 1, 1, groups=[20.0, 50.0] * 3)  # requests 0, 2, 4: all of group 20
    gain.refresh(lambda f: f)
    assert gain.curve(1, 1)[1].item() == pytest.approx((0.1 + 0.3 + 0.5) / 3)
    assert gain.group_table(50.0) is gain.table  # group 50 not sampled yet
    gain.observe(six, 1, 1, groups=[20.0, 50.0] * 3)  # requests 1, 3, 5
    gain.refresh(lambda f: f)
    assert gain.curve(1, 1)[1].item() == pytest.approx(0.35)  # all six, once each
    assert gain.group_table(50.0)[0, 1].item() == pytest.approx(0.4)


def test_shape_gain_keeps_a_table_per_slo_group():
    gain = ShapeGain(max_nodes=2)
    gain.observe(beam([[[0.9], [0.8]], [[0.3], [0.1]]]), 2, 1, groups=[20.0, None])
    gain.refresh(lambda f: f)
    # Group 20's request takes both of the batch's best two nodes (.9, .8) at one node per
    # request: the selection ranks the whole batch.
    assert gain.group_table(20.0)[1].tolist() == pytest.approx([0, 1.7, 1.7])
    # All requests: one node each is the batch's best two (.9, .8) over two requests.
    assert gain.group_table(None)[1].tolist() == pytest.approx([0, 0.85, 1.05])
    assert gain.group_table(50.0) is gain.table  # a group never seen reads the batch's


def test_shape_gain_pools_by_the_weight_the_selection_ranks_by():
    """With a rank weight per request the pool is ordered by f x weight, as the throughput
    phase orders nodes, while what a node returns stays its f: a request weighed down gets
    fewer of the batch's nodes."""
    chains = [[[0.9], [0.8], [0.7]], [[0.6], [0.5], [0.3]]]
    plain, weighed = ShapeGain(max_nodes=3), ShapeGain(max_nodes=3)
    plain.observe(beam(chains), 3, 1, groups=[20.0, 50.0])
    weighed.observe(beam(chains), 3, 1, groups=[20.0, 50.0], rank_weight=torch.tensor([0.5, 1]))
    plain.refresh(lambda f: f)
    weighed.refresh(lambda f: f)
    # By f: .9 .8 | .7 .6 | .5 .3 (two nodes per k). By f x w: .6 .5 | .45 .4 | .35 .3, so
    # k = 1 verifies the second request's .6 and .5, k = 2 adds the first's .9 and .8.
    assert plain.curve(3, 1).tolist() == pytest.approx([0, 0.85, 1.5, 1.9])
    assert weighed.curve(3, 1).tolist() == pytest.approx([0, 0.55, 1.4, 1.9])
    assert weighed.group_table(20.0)[2].tolist() == pytest.approx([0, 0, 1.7, 2.4])
    assert weighed.group_table(50.0)[2].tolist() == pytest.approx([0, 1.1, 1.1, 1.4])


def test_shape_gain_is_what_a_batch_wide_budget_of_k_nodes_per_request_returns():
    # Two requests, 3-deep chains: one the draft reads well (.9, .8, .7), one it does not
    # (.2, .1, .05). k nodes per request spent batch-wide (as cost_budget and the throughput
    # phase spend them) take the easy chain first: k = 1 verifies .9 and .8, not .9 and .2.
    gain = ShapeGain(max_nodes=3)
    gain.observe(beam([[[0.9], [0.8], [0.7]], [[0.2], [0.1], [0.05]]]), 3, 1)
    gain.refresh(lambda f: f)
    assert gain.curve(3, 1).tolist() == pytest.approx([0, 0.85, 1.3, 1.375])
    # Each request's own k best would give (.9 + .2) / 2 = .55 at k = 1: pooling returns more
    # where requests differ, and the same where they do not.
    assert pooled_gain(torch.tensor([[[0.9, 0.9, 0.8, 0.8]]]), torch.tensor([2]), 2).tolist() == [
        [pytest.approx([0.9, 1.7])]
    ]
    # Pools of drafts with 2 and 1 requests, the first cut after its last node of f' > 0 (more
    # nodes per request return nothing more), the second padded with zeros.
    pools = torch.tensor([[[0.9, 0.5, 0.0]], [[0.6, 0.2, 0.0]]])
    assert pooled_gain(pools, torch.tensor([2, 1]), 3).tolist() == [
        [pytest.approx([0.7] * 3)],
        [pytest.approx([0.6, 0.8, 0.8])],
    ]
    assert pooled_gain(torch.zeros(1, 2, 0), torch.tensor([3]), 2).tolist() == [[[0.0] * 2] * 2]


def test_shape_gain_leaves_out_requests_blind_to_the_draft():
    # Request 1 was prefilled without the draft: its f read 0 and say nothing of the shape.
    gain = ShapeGain(max_nodes=2)
    gain.observe(beam([[[0.9], [0.8]], [[0.0], [0.0]]]), 2, 1, groups=[20.0, 20.0])
    gain.refresh(lambda f: f)
    assert gain.curve(2, 1).tolist() == pytest.approx([0, 0.9, 1.7])
    assert gain.group_table(20.0)[1].tolist() == pytest.approx([0, 0.9, 1.7])
    gain.observe(beam([[[0.0], [0.0]]]), 2, 1)  # a draft of blind requests only: no news
    assert gain.version == 1
