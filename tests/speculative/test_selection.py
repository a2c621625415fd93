"""AdaServe selection: hand-computed cases (the paper's Figure 5), a literal reference of
Algorithm 2, properties on random candidate forests, and Algorithm 1 against brute force."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.host_reads import HostReadCounter, on_device
from sgl_adaspec.speculative.selection import (
    Demand,
    Infeasible,
    Selection,
    expected_accepted,
    optimal_trees,
    select_adaserve,
    select_for_demand,
    select_static,
)

FIELDS = ("tokens", "parents", "path_prob", "valid")
PROPERTY_SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


# ---------------------------------------------------------------- factories


def make_candidates(rows: list[list[tuple[int, float]]]) -> Candidates:
    """One request per row; each node is (parent, path_prob). Short rows are padded."""
    num_nodes = max((len(row) for row in rows), default=0)
    parents = torch.full((len(rows), num_nodes), -1, dtype=torch.int64)
    path_prob = torch.zeros(len(rows), num_nodes, dtype=torch.float64)
    valid = torch.zeros(len(rows), num_nodes, dtype=torch.bool)
    for b, row in enumerate(rows):
        for j, (parent, prob) in enumerate(row):
            parents[b, j], path_prob[b, j], valid[b, j] = parent, prob, True
    tokens = torch.arange(len(rows) * num_nodes, dtype=torch.int64).view(len(rows), num_nodes)
    return Candidates(tokens, parents, path_prob, valid)


def build_forest(draw_int, num_requests: int, num_nodes: int, padding: bool = True) -> Candidates:
    """A random candidate forest. f = parent f * k/8 (k in 0..8): exact binary fractions, with
    many ties, equal parent/child values included. Padding nodes carry f = 1 (larger than their
    parent's), which the selection must ignore."""
    parents = torch.full((num_requests, num_nodes), -1, dtype=torch.int64)
    path_prob = torch.zeros(num_requests, num_nodes, dtype=torch.float64)
    valid = torch.zeros(num_requests, num_nodes, dtype=torch.bool)
    for b in range(num_requests):
        for j in range(num_nodes):
            parent = draw_int(-1, j - 1)
            alive = not padding or draw_int(0, 4) > 0
            parent_ok = parent < 0 or bool(valid[b, parent])
            parent_prob = 1.0 if parent < 0 else float(path_prob[b, parent])
            parents[b, j] = parent
            valid[b, j] = alive and parent_ok
            path_prob[b, j] = parent_prob * draw_int(0, 8) / 8 if valid[b, j] else 1.0
    tokens = torch.arange(num_requests * num_nodes, dtype=torch.int64).view(num_requests, -1)
    return Candidates(tokens, parents, path_prob, valid)


@st.composite
def instances(draw, max_requests: int = 5, max_nodes: int = 8, max_required: int = 6):
    """(candidates, required A(r) [B], budget, n_max)."""
    num_requests = draw(st.integers(1, max_requests))
    num_nodes = draw(st.integers(0, max_nodes))
    cands = build_forest(lambda lo, hi: draw(st.integers(lo, hi)), num_requests, num_nodes)
    required = torch.tensor(
        [draw(st.integers(-8, 8 * max_required)) / 8 for _ in range(num_requests)],
        dtype=torch.float64,
    )
    budget = draw(st.integers(0, num_requests * (num_nodes + 1) + 2))
    max_nodes_per_request = draw(st.integers(0, num_nodes + 1))
    return cands, required, budget, max_nodes_per_request


def permute(cands: Candidates, perm: torch.Tensor) -> Candidates:
    return Candidates(
        cands.tokens[perm], cands.parents[perm], cands.path_prob[perm], cands.valid[perm]
    )


# ---------------------------------------------------------------- references


def python_depths(cands: Candidates) -> list[int]:
    """Deepest valid node per request, by walking parents one node at a time."""
    out = []
    for b in range(cands.num_requests):
        deepest = 0
        for j in range(cands.num_nodes):
            if cands.valid[b, j]:
                depth, node = 1, int(cands.parents[b, j])
                while node >= 0:
                    depth, node = depth + 1, int(cands.parents[b, node])
                deepest = max(deepest, depth)
        out.append(deepest)
    return out


def reference_adaserve(cands: Candidates, required, budget: int, n_max: int):
    """Algorithm 2 lines 3-23, literally, one node at a time: (mask, slo_counts) as lists."""
    num_requests, num_nodes = cands.num_requests, cands.num_nodes
    prob, valid, required = cands.path_prob.tolist(), cands.valid.tolist(), required.tolist()
    depths = python_depths(cands)
    left = budget - num_requests  # every root costs one token
    selected = [[False] * num_nodes for _ in range(num_requests)]
    n_acc, slo_counts = [1.0] * num_requests, [0] * num_requests

    def free(b):
        return [j for j in range(num_nodes) if valid[b][j] and not selected[b][j]]

    for b in sorted(range(num_requests), key=lambda r: (-required[r], r)):
        a_cap = min(required[b], depths[b] + 1)
        while n_acc[b] < a_cap and slo_counts[b] < n_max and left > 0 and free(b):
            j = min(free(b), key=lambda k: (-prob[b][k], k))
            selected[b][j] = True
            n_acc[b] += prob[b][j]
            slo_counts[b] += 1
            left -= 1
    while left > 0:
        rest = [(b, j) for b in range(num_requests) for j in free(b)]
        if not rest:
            break
        b, j = min(rest, key=lambda bj: (-prob[bj[0]][bj[1]], bj[0], bj[1]))
        selected[b][j] = True
        left -= 1
    return selected, slo_counts


def brute_force_optimum(cands: Candidates, required, budget: int):
    """max sum_r E[acc(T_r)] s.t. E[acc(T_r)] >= A(r), sum_r |T_r| <= budget (roots counted),
    over every closed subtree of every request's candidate tree; None when infeasible."""
    num_requests = cands.num_requests
    per_request = []  # per request: {number of nodes: best feasible E[acc]}
    for b in range(num_requests):
        nodes = [j for j in range(cands.num_nodes) if cands.valid[b, j]]
        best: dict[int, float] = {}
        for size in range(len(nodes) + 1):
            for subset in itertools.combinations(nodes, size):
                chosen = set(subset)
                if any(
                    int(cands.parents[b, j]) >= 0 and int(cands.parents[b, j]) not in chosen
                    for j in subset
                ):
                    continue  # not a subtree
                value = 1.0 + sum(float(cands.path_prob[b, j]) for j in subset)
                if value >= float(required[b]):
                    best[size] = max(best.get(size, -1.0), value)
        per_request.append(best)
    optimum = None
    for sizes in itertools.product(*(sorted(best) for best in per_request)):
        if sum(sizes) + num_requests <= budget:
            total = sum(best[size] for best, size in zip(per_request, sizes))
            optimum = total if optimum is None else max(optimum, total)
    return optimum


def assert_closed(cands: Candidates, mask: torch.Tensor) -> None:
    parent_selected = mask.gather(1, cands.parents.clamp(min=0)) | (cands.parents < 0)
    assert not bool((mask & ~parent_selected).any()), "a selected node's parent is not selected"
    assert not bool((mask & ~cands.valid).any()), "padding selected"


# ---------------------------------------------------------------- the paper's Figure 5

# Two requests, 3 beam-search steps of width 2: nodes t1, t2 (depth 1), t3, t4 (depth 2),
# t5, t6 (depth 3), stored at indices 0..5. The text gives f(t1(0)) = 0.7, f(t1(1)) = 0.5,
# f(t2(1)) = 0.4; the other values are chosen to agree with the selections it reports.
FIGURE5 = [
    [(-1, 0.7), (-1, 0.2), (0, 0.6), (0, 0.1), (2, 0.45), (2, 0.05)],  # r0
    [(-1, 0.5), (-1, 0.4), (0, 0.35), (1, 0.3), (2, 0.25), (3, 0.2)],  # r1
]
# The figure's A_cap(r0) = 0.6 and A_cap(r1) = 0.8 compare with the draft nodes' f alone; in the
# units of Algorithm 2 (n_acc starts at 1.0 for the root) they are 1.6 and 1.8.
FIGURE5_REQUIRED = torch.tensor([1.6, 1.8], dtype=torch.float64)


def selected_sets(selection: Selection) -> list[set[int]]:
    return [set(row.nonzero().flatten().tolist()) for row in selection.mask]


def test_figure5_selected_sets():
    cands = make_candidates(FIGURE5)
    selection = select_adaserve(cands, FIGURE5_REQUIRED, budget=8, max_nodes_per_request=6)
    # SLO phase: r1 (more behind) takes t1, t2 (1 + 0.5 + 0.4 >= 1.8); r0 takes t1 (1.7 >= 1.6).
    assert selection.slo_counts.tolist() == [1, 2]
    # Throughput phase, remaining budget 8 - 2 roots - 3 = 3: t3(0), t5(0), t3(1).
    assert selected_sets(selection) == [{0, 2, 4}, {0, 1, 2}]
    assert selection.counts.tolist() == [3, 3]
    assert selection.total_tokens == 8
    assert expected_accepted(cands, selection.mask).tolist() == pytest.approx([2.75, 2.25])


def test_figure5_short_budget_serves_most_behind_first():
    cands = make_candidates(FIGURE5)
    # 2 draft tokens after the roots: all of r1's SLO quota, nothing for r0.
    selection = select_adaserve(cands, FIGURE5_REQUIRED, budget=4, max_nodes_per_request=6)
    assert selected_sets(selection) == [set(), {0, 1}]
    # 3: both quotas, no throughput phase.
    selection = select_adaserve(cands, FIGURE5_REQUIRED, budget=5, max_nodes_per_request=6)
    assert selected_sets(selection) == [{0}, {0, 1}]


def test_figure5_is_optimal_for_algorithm1():
    cands = make_candidates(FIGURE5)
    trees = optimal_trees(cands, FIGURE5_REQUIRED, budget=8)
    assert trees is not Infeasible.INVALID
    assert selected_sets(trees) == [{0, 2, 4}, {0, 1, 2}]
    assert brute_force_optimum(cands, FIGURE5_REQUIRED, 8) == pytest.approx(5.0)
    assert optimal_trees(cands, FIGURE5_REQUIRED, budget=4) is Infeasible.INVALID


# ---------------------------------------------------------------- hand-computed rules


def test_n_max_caps_the_slo_phase_only():
    cands = make_candidates([[(-1, 0.9), (0, 0.8), (1, 0.7), (2, 0.6)], [(-1, 0.5)]])
    required = torch.tensor([5.0, 0.0], dtype=torch.float64)
    selection = select_adaserve(cands, required, budget=4, max_nodes_per_request=1)
    # SLO phase stops at n_max = 1 node; the throughput phase then takes 0.8 over r1's 0.5.
    assert selection.slo_counts.tolist() == [1, 0]
    assert selected_sets(selection) == [{0, 1}, set()]


def test_a_cap_uses_the_tree_depth():
    # Depth 1, four children of f = 0.5: A = 10 is capped to d + 1 = 2, met after two nodes.
    cands = make_candidates([[(-1, 0.5)] * 4])
    required = torch.tensor([10.0], dtype=torch.float64)
    selection = select_adaserve(cands, required, budget=5, max_nodes_per_request=4)
    assert selection.slo_counts.tolist() == [2]
    assert selection.counts.tolist() == [4]  # the throughput phase spends the rest


def test_best_effort_and_satisfied_requests_add_nothing_in_slo_phase():
    cands = make_candidates([[(-1, 0.9)], [(-1, 0.9)], [(-1, 0.9)]])
    required = torch.tensor([0.0, 1.0, -2.0], dtype=torch.float64)  # n_acc = 1 already >= A
    selection = select_adaserve(cands, required, budget=3, max_nodes_per_request=4)
    assert selection.slo_counts.tolist() == [0, 0, 0]
    assert selection.counts.tolist() == [0, 0, 0]


def test_budget_below_batch_verifies_roots_only():
    cands = make_candidates([[(-1, 0.9)], [(-1, 0.9)], [(-1, 0.9)]])
    required = torch.tensor([3.0, 3.0, 3.0], dtype=torch.float64)
    selection = select_adaserve(cands, required, budget=1, max_nodes_per_request=4)
    assert not bool(selection.mask.any())
    assert selection.total_tokens == 3
    assert optimal_trees(cands, required, budget=2) is Infeasible.INVALID


def test_equal_parent_child_probability_keeps_closure():
    # Node 1 is node 0's child with the same f; node 2 is a sibling of node 0, also equal.
    cands = make_candidates([[(-1, 0.5), (0, 0.5), (-1, 0.5)]])
    for budget in range(1, 5):
        selection = select_adaserve(cands, torch.tensor([0.0], dtype=torch.float64), budget, 3)
        assert_closed(cands, selection.mask)
        assert selection.counts.tolist() == [min(budget - 1, 3)]
    selection = select_static(cands, 2)
    assert selected_sets(selection) == [{0, 1}]  # (f desc, node index asc)


def test_cross_request_tie_goes_to_lower_request_index():
    cands = make_candidates([[(-1, 0.5)], [(-1, 0.5)]])
    selection = select_adaserve(cands, torch.zeros(2, dtype=torch.float64), 3, 1)
    assert selected_sets(selection) == [{0}, set()]


def test_rank_weight_reorders_the_throughput_phase_only():
    # Request 0 needs 2 tokens: its SLO phase takes its 0.9 node (n_acc 1 -> 1.9 < 2) and its
    # 0.6 node. Request 1 is ahead (A = 0). The throughput phase has 2 nodes left: by f they are
    # request 0's 0.5 and request 1's 0.4; with request 0 weighted 0.5 its 0.5 ranks as 0.25,
    # below request 1's 0.4 and 0.3: the phase takes request 1's two, in their own order.
    cands = make_candidates([[(-1, 0.9), (0, 0.6), (1, 0.5)], [(-1, 0.4), (0, 0.3), (1, 0.2)]])
    required = torch.tensor([2.0, 0.0], dtype=torch.float64)
    by_f = select_adaserve(cands, required, 6, 3)
    assert selected_sets(by_f) == [{0, 1, 2}, {0}]
    weighted = select_adaserve(cands, required, 6, 3, torch.tensor([0.5, 1.0]))
    assert selected_sets(weighted) == [{0, 1}, {0, 1}]
    assert weighted.slo_counts.tolist() == by_f.slo_counts.tolist() == [2, 0]
    # Weights of 1 change nothing.
    ones = select_adaserve(cands, required, 6, 3, torch.ones(2, dtype=torch.float64))
    assert selected_sets(ones) == selected_sets(by_f)
    with pytest.raises(ValueError, match="rank_weight"):
        select_adaserve(cands, required, 6, 3, torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="rank_weight"):
        select_adaserve(cands, required, 6, 3, torch.ones(3))


def test_select_static_is_per_request_top_k():
    cands = make_candidates(FIGURE5)
    selection = select_static(cands, 3)
    assert selected_sets(selection) == [{0, 2, 4}, {0, 1, 2}]
    assert selection.slo_counts.tolist() == [0, 0]
    short = make_candidates([[(-1, 0.3)], [(-1, 0.9), (0, 0.2), (-1, 0.1)]])
    assert select_static(short, 2).counts.tolist() == [1, 2]


def test_empty_candidates():
    cands = make_candidates([[], []])
    selection = select_adaserve(cands, torch.tensor([2.0, 0.0], dtype=torch.float64), 5, 3)
    assert selection.mask.shape == (2, 0) and selection.counts.tolist() == [0, 0]
    assert (
        optimal_trees(cands, torch.tensor([1.0, 0.0], dtype=torch.float64), 2)
        is not Infeasible.INVALID
    )
    assert (
        optimal_trees(cands, torch.tensor([2.0, 0.0], dtype=torch.float64), 5) is Infeasible.INVALID
    )


def test_input_checks():
    cands = make_candidates(FIGURE5)
    with pytest.raises(ValueError, match="required must be"):
        select_adaserve(cands, torch.zeros(3, dtype=torch.float64), 8, 2)
    with pytest.raises(ValueError, match="NaN"):
        select_adaserve(cands, torch.tensor([float("nan"), 1.0]), 8, 2)
    with pytest.raises(ValueError, match="budget"):
        select_adaserve(cands, FIGURE5_REQUIRED, -1, 2)
    with pytest.raises(ValueError, match="max_nodes_per_request"):
        select_adaserve(cands, FIGURE5_REQUIRED, 8, -1)
    # A weight above 1 could lift a throughput key to an SLO-phase key (`Demand.serve_key`).
    for weight in (0.0, 1.5):
        with pytest.raises(ValueError, match=r"rank_weight must be \[B\] = \[2\] in \(0, 1\]"):
            select_adaserve(cands, FIGURE5_REQUIRED, 8, 2, torch.tensor([1.0, weight]))
    with pytest.raises(ValueError, match="padding"):
        padded = make_candidates([[(-1, 0.5)], []])
        expected_accepted(padded, torch.ones(2, 1, dtype=torch.bool))


# ---------------------------------------------------------------- Candidates


def test_candidates_depth():
    cands = make_candidates([[(-1, 0.9), (0, 0.8), (-1, 0.1), (1, 0.7), (2, 0.05)], [(-1, 0.5)]])
    assert cands.depth[0].tolist() == [1, 2, 1, 3, 2]
    assert cands.max_depth.tolist() == [3, 1]


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(parents=torch.tensor([[-1, 1]])), "earlier node index"),
        (dict(parents=torch.tensor([[-2, 0]])), "earlier node index"),
        (dict(valid=torch.tensor([[False, True]])), "parent 0 is padding"),
        (dict(path_prob=torch.tensor([[0.5, 0.6]])), "never increases"),
        (dict(path_prob=torch.tensor([[float("nan"), 0.1]])), r"in \[0, 1\]"),
        (dict(path_prob=torch.tensor([[1.5, 0.1]])), r"in \[0, 1\]"),
        (dict(tokens=torch.tensor([[1, 2]], dtype=torch.int32)), "tokens must be int64"),
        (dict(parents=torch.tensor([[-1.0, 0.0]])), "parents must be int64"),
        (dict(path_prob=torch.tensor([[1, 0]])), "path_prob must be floating"),
        (dict(valid=torch.tensor([[1, 1]])), "valid must be bool"),
        (dict(tokens=torch.tensor([[1, 2, 3]])), "all fields must be"),
        (dict(tokens=torch.tensor([1, 2])), r"must be \[B, N\]"),
    ],
)
def test_candidates_rejects(change, message):
    fields = dict(
        tokens=torch.tensor([[5, 6]]),
        parents=torch.tensor([[-1, 0]]),
        path_prob=torch.tensor([[0.5, 0.4]]),
        valid=torch.tensor([[True, True]]),
    )
    fields.update(change)
    with pytest.raises((ValueError, TypeError), match=message):
        Candidates(**fields)


def test_candidates_ignore_padding_values():
    # Padding may hold anything (here f > parent and NaN) as long as the tree shape is valid.
    cands = Candidates(
        tokens=torch.tensor([[5, 6, 7]]),
        parents=torch.tensor([[-1, 0, 0]]),
        path_prob=torch.tensor([[0.5, 0.9, float("nan")]]),
        valid=torch.tensor([[True, False, False]]),
    )
    selection = select_adaserve(cands, torch.tensor([0.0]), 10, 3)
    assert selection.mask.tolist() == [[True, False, False]]


# ---------------------------------------------------------------- properties


@PROPERTY_SETTINGS
@given(instances())
def test_matches_literal_algorithm2(instance):
    cands, required, budget, n_max = instance
    selection = select_adaserve(cands, required, budget, n_max)
    mask, slo_counts = reference_adaserve(cands, required, budget, n_max)
    assert selection.mask.tolist() == mask
    assert selection.slo_counts.tolist() == slo_counts
    assert cands.max_depth.tolist() == python_depths(cands)


@PROPERTY_SETTINGS
@given(instances())
def test_on_the_device_it_matches_algorithm2_without_a_host_read(instance):
    # Budget and n_max as 0-d tensors, the candidates device-resident (`host_reads`): the
    # selection a GPU makes between its draft and its verify, node for node the literal one.
    cands, required, budget, n_max = instance
    marked = Candidates.trusted(*(on_device(getattr(cands, name)) for name in FIELDS))
    with HostReadCounter() as reads:
        selection = select_adaserve(
            marked, required, on_device(torch.tensor(budget)), on_device(torch.tensor(n_max))
        )
    assert reads.count == 0, reads.sites
    mask, slo_counts = reference_adaserve(cands, required, budget, n_max)
    assert selection.mask.tolist() == mask
    assert selection.slo_counts.tolist() == slo_counts


def draw_rank_weights(data, num_requests: int) -> torch.Tensor:
    """[B] throughput-phase weights from a few values, ties among them likely."""
    choices = st.sampled_from([0.5, 0.75, 1.0])
    drawn = data.draw(st.lists(choices, min_size=num_requests, max_size=num_requests))
    return torch.tensor(drawn, dtype=torch.float64)


@PROPERTY_SETTINGS
@given(instances(), st.data())
def test_a_demand_made_before_the_draft_selects_as_one_made_after_it(instance, data):
    # A policy orders the requests before the draft; the selection then drops those whose
    # whole tree cannot reach A(r) (A(r) -> 0) without sorting again: node for node the
    # selection of the dropped A(r) sorted afresh.
    cands, required, budget, n_max = instance
    weight = draw_rank_weights(data, len(required))
    beyond = required > 1.0 + torch.where(cands.valid, cands.path_prob, 0.0).sum(dim=1)
    demand = Demand.of(required, weight, drop_beyond_reach=True)
    fresh = select_adaserve(cands, torch.where(beyond, 0.0, required), budget, n_max, weight)
    made_before = select_for_demand(cands, demand, budget, n_max)
    assert torch.equal(made_before.mask, fresh.mask)
    assert torch.equal(made_before.slo_counts, fresh.slo_counts)


@PROPERTY_SETTINGS
@given(instances(), st.data())
def test_a_demand_the_bonus_token_meets_skips_the_slo_phase_alike(instance, data):
    # Where every A(r) <= 1 (known with the demand) the selection skips the SLO phase and
    # ranks in node order: node for node what the full two phases select.
    cands, required, budget, n_max = instance
    required = required.clamp(max=1.0)
    weight = draw_rank_weights(data, len(required))
    demand = Demand.of(required, weight)
    assert not demand.asks_past_the_bonus
    both_phases = dataclasses.replace(demand, asks_past_the_bonus=True)
    skipped = select_for_demand(cands, demand, budget, n_max)
    full = select_for_demand(cands, both_phases, budget, n_max)
    assert torch.equal(skipped.mask, full.mask)
    assert torch.equal(skipped.counts, full.counts)
    assert torch.equal(skipped.slo_counts, full.slo_counts)


@PROPERTY_SETTINGS
@given(instances())
def test_closure_budget_and_n_max(instance):
    cands, required, budget, n_max = instance
    selection = select_adaserve(cands, required, budget, n_max)
    assert_closed(cands, selection.mask)
    assert selection.counts.tolist() == selection.mask.sum(dim=1).tolist()
    draft_budget = max(budget - cands.num_requests, 0)
    # The whole budget is spent unless the candidates run out.
    assert int(selection.counts.sum()) == min(draft_budget, int(cands.num_valid.sum()))
    assert selection.total_tokens <= max(budget, cands.num_requests)
    assert bool((selection.slo_counts <= n_max).all())
    assert bool((selection.slo_counts <= selection.counts).all())
    again = select_adaserve(cands, required, budget, n_max)
    assert torch.equal(again.mask, selection.mask)  # deterministic
    assert torch.equal(again.slo_counts, selection.slo_counts)


@PROPERTY_SETTINGS
@given(instances())
def test_most_behind_request_is_served_first(instance):
    cands, required, _, n_max = instance
    num_requests = cands.num_requests
    ample = select_adaserve(cands, required, num_requests * (cands.num_nodes + 1), n_max)
    first = int(torch.sort(required, descending=True, stable=True).indices[0])
    quota = int(ample.slo_counts[first])
    # A budget that covers exactly the most-behind request's SLO quota: it gets all of it.
    selection = select_adaserve(cands, required, num_requests + quota, n_max)
    expected = torch.zeros(num_requests, dtype=torch.int64)
    expected[first] = quota
    assert selection.slo_counts.tolist() == expected.tolist()
    assert selection.counts.tolist() == expected.tolist()


@st.composite
def distinct_instances(draw):
    """Instances without ties (distinct f across all nodes, distinct A), so that permuting
    requests cannot change a tie-break."""
    cands, required, budget, n_max = draw(instances(max_nodes=6))
    num_requests, num_nodes = cands.valid.shape
    node_id = torch.arange(num_requests * num_nodes, dtype=torch.float64).view(num_requests, -1)
    # f / 2 + (M - id) * 2^-30: distinct, still in [0, 1] and still decreasing along paths
    # (a child has a larger id than its parent); f's grid (2^-19 at depth 6) is much coarser.
    path_prob = cands.path_prob / 2 + (num_requests * num_nodes - node_id) * 2.0**-30
    cands = Candidates(cands.tokens, cands.parents, path_prob, cands.valid)
    required = required + torch.arange(num_requests, dtype=torch.float64) * 2.0**-20
    perm = torch.tensor(draw(st.permutations(range(num_requests))), dtype=torch.int64)
    return cands, required, budget, n_max, perm


@PROPERTY_SETTINGS
@given(distinct_instances())
def test_permuting_requests_permutes_the_selection(instance):
    cands, required, budget, n_max, perm = instance
    selection = select_adaserve(cands, required, budget, n_max)
    permuted = select_adaserve(permute(cands, perm), required[perm], budget, n_max)
    assert torch.equal(permuted.mask, selection.mask[perm])
    assert torch.equal(permuted.slo_counts, selection.slo_counts[perm])


# ---------------------------------------------------------------- optimality (Algorithm 1)


def check_against_brute_force(cands: Candidates, required: torch.Tensor, budget: int) -> bool:
    """Asserts Algorithm 1 matches brute force; returns whether the instance is feasible."""
    optimum = brute_force_optimum(cands, required, budget)
    trees = optimal_trees(cands, required, budget)
    if optimum is None:
        assert trees is Infeasible.INVALID
        return False
    assert trees is not Infeasible.INVALID
    assert_closed(cands, trees.mask)
    accepted = expected_accepted(cands, trees.mask)  # [B]
    assert bool((accepted >= required).all())
    assert trees.total_tokens <= budget
    assert float(accepted.sum()) == optimum  # exact: every f is a binary fraction
    # The practical selection equals it when A_cap = A and n_max does not bind.
    if bool((required <= cands.max_depth + 1).all()):
        practical = select_adaserve(cands, required, budget, cands.num_nodes)
        assert float(expected_accepted(cands, practical.mask).sum()) == optimum
    return True


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_optimal_trees_match_brute_force(data):
    draw_int = lambda lo, hi: data.draw(st.integers(lo, hi))  # noqa: E731
    num_requests = draw_int(1, 2)
    cands = build_forest(draw_int, num_requests, draw_int(0, 6))
    required = torch.tensor([draw_int(0, 32) / 8 for _ in range(num_requests)], dtype=torch.float64)
    check_against_brute_force(cands, required, draw_int(0, 7))


def test_optimal_trees_on_many_seeded_instances():
    rng = random.Random(20250101)
    outcomes = {True: 0, False: 0}
    for _ in range(300):
        num_requests = rng.randint(1, 3)
        max_nodes = 6 if num_requests < 3 else 4
        cands = build_forest(
            rng.randint, num_requests, rng.randint(0, max_nodes), padding=rng.random() < 0.3
        )
        required = torch.tensor(
            [rng.randint(0, 24) / 8 for _ in range(num_requests)], dtype=torch.float64
        )
        outcomes[check_against_brute_force(cands, required, rng.randint(0, 7))] += 1
    # Both answers occur often: the comparison covers Infeasible.INVALID as well as optimal trees.
    assert outcomes[True] >= 50 and outcomes[False] >= 50, outcomes
