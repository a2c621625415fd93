"""Token-wise early exit inside verification (FASER, seed 001, section 4.2), the pure part.

After the first `exit_layer` layers of the target's verify pass, each draft node's token is
tested against the intermediate logits of its parent's row (the row that predicts it): if at
least K vocabulary entries score strictly higher than the draft token (the token is outside
the top-K; FASER's test, which needs no top-K materialised), the node is predicted to be
rejected and leaves the pass together with its subtree. The surviving nodes run the remaining
layers. Pruned nodes are cut out of the tree before acceptance, so the walk stops at their
parent and takes the bonus token from the parent's full-depth logits: greedy outputs stay
exactly those of full verification; a wrong exit only costs accepted tokens.

When it pays (eq. 5-10, with measured latencies; here the test is not asynchronous, so its
time is plain overhead): pruning k_rej tokens saves the remaining layers' share of their verify
time, the test costs its measured time per tested row,

    worthwhile  <=>  k_rej x t_token x (L - exit_layer) / L  >  tested_rows x t_test

with k_rej = sum_i s_i (1 - a_i) each request's expected rejected draft tokens (eq. 5-6),
t_token the verify pass's marginal latency per token (the fitted verify-latency model) and
t_test the test's measured latency per tested row (unknown until the first test: test once).

Pure (tensors in, tensors out). Dims: R packed rows of the verify pass, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class EarlyExitPlan:
    """What the verify pass does this iteration: test after `exit_layer` layers (None: half the
    model) with top-`topk`. For the eq. 10 trigger: `expected_rejected` (k_rej, eq. 6),
    `verify_ms_per_token` (t_token, None: unknown) and `test_ms_per_row` (t_test, None: not
    measured yet); `forced` skips the trigger."""

    exit_layer: int | None
    topk: int
    expected_rejected: float
    forced: bool = False
    verify_ms_per_token: float | None = None
    test_ms_per_row: float | None = None


def outranked_by(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """How many vocabulary entries score strictly higher than `tokens` in each row.
    logits [R, V] float, tokens [R] int64 -> [R] int64."""
    own = logits.gather(1, tokens.unsqueeze(1))  # [R, 1]
    return (logits > own).sum(dim=1)


def exiting_rows(
    row_token: torch.Tensor,
    row_parent: torch.Tensor,
    parent_logits: torch.Tensor,
    topk: int,
) -> torch.Tensor:
    """Rows that leave the pass: a draft row whose token is outside its parent row's top-`topk`,
    and every descendant of such a row.

    row_token [R] int64: the token each row feeds; row_parent [R] int64: the row of its parent
    in the tree (-1 for a request's root, which is never tested); parent_logits [R, V]: the
    intermediate logits of row_parent's row for each row (any values where row_parent is -1).
    Parents precede their children in row order (SGLang's node order). Returns [R] bool."""
    if topk < 1:
        raise ValueError(f"early-exit top-k must be >= 1, got {topk}")
    tested = row_parent >= 0
    outside = outranked_by(parent_logits, torch.where(tested, row_token, 0)) >= topk
    dead = tested & outside
    # Propagate down the tree: one step per level, at most R levels.
    parent = row_parent.clamp(min=0)
    for _ in range(row_token.numel()):
        grown = dead | (tested & dead[parent])
        if torch.equal(grown, dead):
            break
        dead = grown
    return dead


def worth_exiting(plan: EarlyExitPlan, tested_rows: int, num_layers: int, exit_layer: int) -> bool:
    """FASER eq. 10 (see module) for a pass of `num_layers` layers tested after `exit_layer`."""
    if tested_rows == 0:
        return False
    if plan.forced or plan.test_ms_per_row is None:
        return True  # the cost is measured by testing
    if plan.verify_ms_per_token is None:
        return False
    remaining = max(num_layers - exit_layer, 0) / num_layers
    saved_ms = plan.expected_rejected * plan.verify_ms_per_token * remaining
    return saved_ms > tested_rows * plan.test_ms_per_row


def expected_rejected(
    lengths: torch.Tensor, committed_mean: torch.Tensor, observed: torch.Tensor
) -> float:
    """FASER eq. 5-6: sum_i s_i (1 - a_i) = sum_i (s_i - committed_i). lengths [B] (draft
    tokens each request verifies), committed_mean [B] (accepted draft tokens per iteration at
    that length), observed [B] bool (False: no history, counted as half rejected)."""
    rejected = torch.where(
        observed, (lengths - committed_mean).clamp(min=0.0), 0.5 * lengths.to(torch.float64)
    )
    return float(rejected.sum())
