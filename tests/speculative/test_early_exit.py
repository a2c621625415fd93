"""Token-wise early exit (FASER section 4.2): the top-K test, subtree propagation, the eq. 10
trigger and eq. 5-6's expected rejected tokens, on hand-computed cases."""

from __future__ import annotations

import pytest
import torch

from sgl_adaspec.speculative.early_exit import (
    EarlyExitPlan,
    exiting_rows,
    expected_rejected,
    outranked_by,
    worth_exiting,
)


def test_outranked_by_counts_strictly_higher_scores():
    logits = torch.tensor([[0.1, 0.5, 0.5, 0.9], [3.0, 2.0, 1.0, 0.0]])
    assert outranked_by(logits, torch.tensor([1, 0])).tolist() == [1, 0]  # tie not counted
    assert outranked_by(logits, torch.tensor([0, 3])).tolist() == [3, 3]


def test_a_token_outside_the_top_k_exits_with_its_subtree():
    # One request, rows: 0 root, 1 <- 0, 2 <- 1, 3 <- 0 (a fan), 4 <- 3.
    # Vocabulary 4; each row's parent logits rank tokens 0 > 1 > 2 > 3.
    parent = torch.tensor([-1, 0, 1, 0, 3])
    token = torch.tensor([9, 1, 0, 3, 0])  # row 3's token is the parent's 4th choice
    ranked = torch.tensor([4.0, 3.0, 2.0, 1.0]).expand(5, 4)
    # K = 2: row 1 (rank 2, one above it) stays, row 3 (three above) exits, so does its child 4.
    assert exiting_rows(token, parent, ranked, 2).tolist() == [False, False, False, True, True]
    # K = 1: only top-1 tokens stay; row 1 exits, taking row 2 although row 2's own token is
    # its parent's top-1.
    assert exiting_rows(token, parent, ranked, 1).tolist() == [False, True, True, True, True]
    # K = 4: everything stays; roots are never tested, whatever their row's token.
    assert not exiting_rows(token, parent, ranked, 4).any()


def test_exit_propagates_down_a_long_chain_and_across_requests():
    # Two requests packed: rows 0-3 a chain (root 0), rows 4-6 a chain (root 4).
    parent = torch.tensor([-1, 0, 1, 2, -1, 4, 5])
    token = torch.tensor([0, 0, 1, 0, 0, 0, 0])  # only row 2 is outside the top-1
    ranked = torch.tensor([2.0, 1.0]).expand(7, 2)
    assert exiting_rows(token, parent, ranked, 1).tolist() == [
        False, False, True, True, False, False, False,
    ]  # fmt: skip
    with pytest.raises(ValueError, match="top-k must be >= 1"):
        exiting_rows(token, parent, ranked, 0)


def plan(**kw) -> EarlyExitPlan:
    return EarlyExitPlan(exit_layer=15, topk=10, **kw)


def test_trigger_compares_the_saved_verify_time_with_the_measured_test_time():
    # 30 layers, test after 15: a rejected token saves half its 2 ms of verify time, 1 ms.
    # 4 tested rows at 0.5 ms cost 2 ms: 2 expected rejections do not pay, 3 do.
    measured = {"verify_ms_per_token": 2.0, "test_ms_per_row": 0.5}
    assert not worth_exiting(plan(expected_rejected=2.0, **measured), 4, 30, 15)
    assert worth_exiting(plan(expected_rejected=3.0, **measured), 4, 30, 15)
    assert not worth_exiting(plan(expected_rejected=100.0, **measured), 4, 30, 30)  # nothing left
    # The test's cost is unknown until it ran once: test (and measure); forced: always test.
    assert worth_exiting(plan(expected_rejected=0.0, verify_ms_per_token=2.0), 4, 30, 15)
    assert worth_exiting(plan(expected_rejected=0.0, forced=True, **measured), 4, 30, 15)
    # No verify-latency model: the saving cannot be estimated; no draft row: nothing to test.
    assert not worth_exiting(plan(expected_rejected=9.0, test_ms_per_row=0.5), 4, 30, 15)
    assert not worth_exiting(plan(expected_rejected=9.0, forced=True), 0, 30, 15)


def test_expected_rejected_is_length_minus_committed_and_half_when_unknown():
    lengths = torch.tensor([4, 2, 6])
    committed = torch.tensor([1.5, 3.0, 0.0], dtype=torch.float64)
    observed = torch.tensor([True, True, False])
    # 4 - 1.5 = 2.5; 2 - 3 clipped to 0; unobserved: 6 / 2 = 3.
    assert expected_rejected(lengths, committed, observed) == pytest.approx(5.5)
