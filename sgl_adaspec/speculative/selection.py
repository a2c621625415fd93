"""Selection: which candidate nodes each request sends to verification under a token budget.

Pure tensor code (any device, no SGLang): sorting, cumulative sums and scatters over [B, N]; no
Python loop over requests or nodes. Dims and terms as in `speculative/candidates.py`
(B requests, N candidate nodes per request; root, bonus token, f, budget).

Counting conventions, taken from the AdaServe paper (seed 003):
- The root of every request is always verified and counts 1 against the budget (Algorithm 2
  line 7, `B <- B - 1` per request; Theorem 4.1 uses sum_i |T_i| = B with the roots in |T_i|).
  `Selection` holds the candidate nodes only; the root is implicit.
- n_acc starts at 1.0 per request (the root, i.e. the bonus token) and grows by f(v) per added
  node, so it is E[acc(T)] of Theorem 3.1, in the same units as A(r) and A_cap(r) = min(A, d+1).
  (The paper's Figure 5 example quotes A_cap values 0.6 and 0.8 and compares them with the sum of
  the *draft* nodes' f only; in the units of its own Algorithm 2 those are 1.6 and 1.8. The tests
  reproduce the figure's selected sets with the values shifted by the root's 1.)
- n_max (`max_nodes_per_request`) is, as Algorithm 2's inputs define it, the most candidate
  nodes the SLO phase adds to one request; the root does not count toward it.
- Budgets: the paper's loop guards read `B >= 0`; taken literally they add one node past the
  budget. Here a node is added only while budget remains (> 0).
- Budget smaller than the batch (`budget < B`): every root is still verified (a running request
  always gets its bonus token) and no candidate node is selected, so the verified total is B.
  Otherwise the verified total (roots included) never exceeds `budget`.

Tie rule (deterministic, device independent):
- nodes within a request rank by (f desc, node index asc);
- requests in the SLO phase rank by (A(r) desc, request index asc);
- the throughput phase ranks all remaining nodes by (f desc, request index asc, node index asc).
Since f(child) <= f(parent) and a parent's index is smaller than its child's, a parent always
ranks before its children (equal f included), so every request's selection is a prefix of its
own ranking and therefore closed under "parent of". With breadth-first node order the rule
equals (f desc, depth asc, node index asc).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import torch

from sgl_adaspec.scheduler.slo import capped_required
from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.host_copy import to_host
from sgl_adaspec.speculative.host_reads import free_to_read


@dataclass(frozen=True)
class Selection:
    """Which candidate nodes each request verifies. Fields:
    - mask [B, N] bool: selected candidate nodes (closed under parent; the root is implicit);
    - counts [B] int64: selected candidate nodes per request (root not counted);
    - slo_counts [B] int64: of `counts`, the nodes chosen by the SLO-customized phase (AdaServe)
      or to meet A(r) (Algorithm 1); zeros for the static baseline.
    """

    mask: torch.Tensor
    counts: torch.Tensor
    slo_counts: torch.Tensor

    def __post_init__(self) -> None:
        if self.mask.dtype != torch.bool or self.mask.ndim != 2:
            raise ValueError(
                f"Selection.mask must be [B, N] bool, got {self.mask.dtype} "
                f"{tuple(self.mask.shape)}"
            )
        for name in ("counts", "slo_counts"):
            value = getattr(self, name)
            if value.shape != self.mask.shape[:1]:
                raise ValueError(f"Selection.{name} must be [B], got {tuple(value.shape)}")

    def to_host(self) -> Selection:
        """The same selection on its way to the host (`host_copy`)."""
        return Selection(to_host(self.mask), to_host(self.counts), to_host(self.slo_counts))

    @property
    def num_tokens(self) -> torch.Tensor:
        """[B] int64: tokens each request verifies, its root included."""
        return self.counts + 1

    @property
    def total_tokens(self) -> int:
        """Tokens in the verify forward pass, roots included."""
        return int(self.counts.sum()) + self.mask.shape[0]


class Infeasible(enum.Enum):
    """Algorithm 1's answer when no set of trees meets every A(r) within the budget."""

    INVALID = "invalid"


@dataclass(frozen=True)
class Demand:
    """What the SLO phase serves and the throughput phase ranks by, checked once where it is
    made (a policy makes it with the draft's plan, off the critical path). Fields:
    - required [B] float: A(r), 0 for best effort, never NaN;
    - urgency [B] int64: the requests by A(r) desc, ties by index (the SLO phase's order);
    - rank_weight [B] float > 0 or None: the throughput phase's weight on f (None: f alone).
    """

    required: torch.Tensor
    urgency: torch.Tensor
    rank_weight: torch.Tensor | None = None

    @classmethod
    def of(cls, required: torch.Tensor, rank_weight: torch.Tensor | None = None) -> Demand:
        _check_required(required)
        if rank_weight is not None and (
            rank_weight.shape != required.shape
            or (free_to_read(rank_weight) and not bool((rank_weight > 0).all()))
        ):
            raise ValueError(
                f"rank_weight must be [B] = [{required.shape[0]}] and > 0, got {rank_weight}"
            )
        urgency = torch.sort(required, descending=True, stable=True).indices
        return cls(required, urgency, rank_weight)

    def dropping(self, dropped: torch.Tensor) -> Demand:
        """A(r) = 0 where `dropped` [B] bool. The order stands: a request that asks for
        nothing is granted nothing wherever it is served, and the others keep their order."""
        return Demand(torch.where(dropped, 0.0, self.required), self.urgency, self.rank_weight)

    def to(self, device: torch.device) -> Demand:
        """The same demand on `device`, by copies that do not wait on the device."""
        if self.required.device == device:
            return self
        weight = self.rank_weight
        return Demand(
            self.required.to(device, non_blocking=True),
            self.urgency.to(device, non_blocking=True),
            None if weight is None else weight.to(device, non_blocking=True),
        )


def select_adaserve(
    cands: Candidates,
    required: torch.Tensor,
    budget: int | torch.Tensor,
    max_nodes_per_request: int | torch.Tensor,
    rank_weight: torch.Tensor | None = None,
) -> Selection:
    """AdaServe's two selection phases (Algorithm 2, lines 9-23) over the candidate trees.

    required [B] float: A(r) (`scheduler.slo.required_tokens`; 0 for best effort). Each request's
    target is A_cap(r) = min(A(r), d_r + 1) with d_r the depth of its candidate tree.
    1. SLO-customized: requests in descending A(r) (most behind first); each adds its nodes in
       descending f while n_acc < A_cap(r), fewer than `max_nodes_per_request` were added and
       budget remains; n_acc starts at 1 (root) and grows by f(v).
    2. Throughput-optimized: the remaining budget goes to the batch-wide top nodes by f among
       those not yet selected (by f x rank_weight[r], [B] > 0, where given).
    `budget` counts the roots (see the module docstring for budget < B). `budget` and
    `max_nodes_per_request` may be 0-d int64 tensors on the candidates' device (computed there
    from the draft): the selection is tensor work only, no host read of the candidates.
    """
    _check_shape(required, cands.num_requests)
    return select_for_demand(cands, Demand.of(required, rank_weight), budget, max_nodes_per_request)


def select_for_demand(
    cands: Candidates,
    demand: Demand,
    budget: int | torch.Tensor,
    max_nodes_per_request: int | torch.Tensor,
) -> Selection:
    """`select_adaserve` for a `Demand` made before the draft: only the draft's own work
    runs between the draft and its verify."""
    num_requests = cands.num_requests
    _check_shape(demand.required, num_requests)
    _check_budget(budget)
    if isinstance(max_nodes_per_request, int) and max_nodes_per_request < 0:
        raise ValueError(f"max_nodes_per_request must be >= 0, got {max_nodes_per_request}")
    device = cands.valid.device
    demand = demand.to(device)
    order, sorted_prob = _rank_nodes(cands)
    target = capped_required(demand.required, cands.max_depth)  # [B] A_cap
    # Phase 1 for one request is "take its ranked nodes while n_acc < A_cap": n_acc before the
    # k-th node is 1 + (sum of the first k f's), non-decreasing in k, so the nodes taken form a
    # prefix whose length is the number of k with n_acc_before[k] < A_cap.
    wanted = _acc_before(sorted_prob) < target[:, None]  # [B, N] in rank order
    real = cands.valid.gather(1, order)  # [B, N] in rank order
    quota = (wanted & real).sum(dim=1).clamp(max=max_nodes_per_request)  # [B]
    # Requests are served in urgency order until the budget runs out: request i (in that order)
    # gets min(quota_i, what is left after the requests before it).
    if not isinstance(budget, torch.Tensor):  # filled on the device: no copy to wait for
        budget = torch.full((), budget, dtype=torch.long, device=device)
    if isinstance(max_nodes_per_request, torch.Tensor):
        max_nodes_per_request = max_nodes_per_request.to(device, non_blocking=True)
    draft_budget = (budget - num_requests).clamp(min=0)
    quota_sorted = quota[demand.urgency]  # [B]
    served_before = quota_sorted.cumsum(0) - quota_sorted  # [B]
    granted_sorted = torch.minimum((draft_budget - served_before).clamp(min=0), quota_sorted)
    slo_counts = torch.empty_like(quota).scatter_(0, demand.urgency, granted_sorted)  # [B]
    return _finish(cands, order, slo_counts, draft_budget, demand.rank_weight)


def optimal_trees(cands: Candidates, required: torch.Tensor, budget: int) -> Selection | Infeasible:
    """AdaServe Algorithm 1 on the given candidate trees: the optimal trees, or INVALID.

    Maximizes sum_r E[acc(T_r)] subject to E[acc(T_r)] >= A(r) for every r and
    sum_r |T_r| <= budget (roots included), over subtrees of the candidate trees. Step 1 gives
    each request the fewest top-f nodes that reach A(r) (uncapped, no n_max); step 2 spends the
    rest on the batch-wide top nodes by f. INVALID when budget < B, when a request's whole tree
    cannot reach A(r), or when the step-1 needs exceed the budget.
    """
    num_requests, num_nodes = _check_inputs(cands, required, budget)
    if budget < num_requests:
        return Infeasible.INVALID
    order, sorted_prob = _rank_nodes(cands)
    acc_before = _acc_before(sorted_prob)  # [B, N]
    if num_nodes:
        acc_all = acc_before[:, -1] + sorted_prob[:, -1]  # [B]: n_acc with the whole tree
    else:
        acc_all = torch.ones_like(required)
    if bool((acc_all < required).any()):
        return Infeasible.INVALID
    need = ((acc_before < required[:, None]) & _rank_valid(cands)).sum(dim=1)  # [B]
    draft_budget = budget - num_requests
    if int(need.sum()) > draft_budget:
        return Infeasible.INVALID
    return _finish(cands, order, need, draft_budget)


def select_static(cands: Candidates, num_per_request: int) -> Selection:
    """The baseline: SGLang's EAGLE-2 rerank, each request's top-`num_per_request` nodes by f.

    `num_per_request` counts candidate nodes, so it is SGLang's `num_draft_tokens - 1` (SGLang's
    count includes the root). Ties follow the module's rule (f desc, node index asc).
    """
    if num_per_request < 0:
        raise ValueError(f"num_per_request must be >= 0, got {num_per_request}")
    order, _ = _rank_nodes(cands)
    lengths = cands.num_valid.clamp(max=num_per_request)  # [B]
    mask = _prefix_mask(order, lengths)
    return Selection(mask, lengths, torch.zeros_like(lengths))


def expected_accepted(cands: Candidates, mask: torch.Tensor) -> torch.Tensor:
    """[B] float: E[acc(T_r)] = 1 + sum of f over r's selected nodes (AdaServe Theorem 3.1).

    The 1 is the root: the bonus token every verification yields.
    """
    if mask.shape != cands.valid.shape or mask.dtype != torch.bool:
        raise ValueError(
            f"mask must be [B, N] bool like the candidates, got {mask.dtype} {tuple(mask.shape)}"
        )
    if free_to_read(mask) and bool((mask & ~cands.valid).any()):
        raise ValueError("mask selects padding nodes")
    return 1.0 + torch.where(mask, cands.path_prob, 0.0).sum(dim=1)


def _check_inputs(cands: Candidates, required: torch.Tensor, budget: int) -> tuple[int, int]:
    num_requests, num_nodes = cands.valid.shape
    _check_shape(required, num_requests)
    _check_required(required)
    _check_budget(budget)
    return num_requests, num_nodes


def _check_shape(required: torch.Tensor, num_requests: int) -> None:
    if required.shape != (num_requests,):
        raise ValueError(f"required must be [B] = [{num_requests}], got {tuple(required.shape)}")


def _check_required(required: torch.Tensor) -> None:
    if not required.is_floating_point():
        raise TypeError(f"required must be floating, got {required.dtype}")
    if free_to_read(required) and bool(torch.isnan(required).any()):
        raise ValueError(f"required has NaN (use 0 for best effort): {required}")


def _check_budget(budget: int | torch.Tensor) -> None:
    if isinstance(budget, torch.Tensor):
        if budget.ndim != 0 or budget.is_floating_point():
            raise ValueError(f"a tensor budget must be a 0-d integer, got {budget!r}")
    elif not isinstance(budget, int) or budget < 0:
        raise ValueError(f"budget must be an int >= 0, got {budget!r}")


def _rank_nodes(cands: Candidates) -> tuple[torch.Tensor, torch.Tensor]:
    """Each request's nodes ranked by (f desc, node index asc), padding last.

    Returns order [B, N] int64 (node index at each rank) and sorted_prob [B, N] (f at each rank,
    0 for padding).
    """
    key = torch.where(cands.valid, cands.path_prob, -math.inf)  # [B, N]
    # A stable descending sort keeps equal keys in index order: the (f desc, index asc) rule.
    sorted_key, order = torch.sort(key, dim=1, descending=True, stable=True)
    return order, sorted_key.clamp(min=0.0)


def _rank_valid(cands: Candidates) -> torch.Tensor:
    """[B, N] bool in rank order: rank k holds a real node (padding ranks last)."""
    ranks = torch.arange(cands.num_nodes, device=cands.valid.device)  # [N]
    return ranks < cands.num_valid[:, None]


def _acc_before(sorted_prob: torch.Tensor) -> torch.Tensor:
    """[B, N]: n_acc before the node at rank k is added, i.e. 1 + sum of the first k f's.

    Summed left to right starting from 1.0, as Algorithm 2's n_acc += f(v) does (bit for bit
    on CPU; a parallel scan on GPU may round differently in the last place).
    """
    ones = torch.ones_like(sorted_prob[:, :1])  # [B, 1]
    return torch.cat([ones, sorted_prob[:, :-1]], dim=1).cumsum(dim=1)


def _prefix_mask(order: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """[B, N] bool in node order: the first lengths[b] ranked nodes of each request."""
    ranks = torch.arange(order.shape[1], device=order.device)  # [N]
    in_prefix = ranks < lengths[:, None]  # [B, N] in rank order
    return torch.zeros_like(in_prefix).scatter_(1, order, in_prefix)


def _finish(
    cands: Candidates,
    order: torch.Tensor,
    slo_counts: torch.Tensor,
    draft_budget: int | torch.Tensor,
    rank_weight: torch.Tensor | None = None,
) -> Selection:
    """Phase-1 prefixes of `slo_counts` nodes, then the batch-wide top of the rest by f
    (x rank_weight [B])."""
    slo_mask = _prefix_mask(order, slo_counts)  # [B, N]
    left = draft_budget - slo_counts.sum()
    mask = slo_mask | _global_top(cands, slo_mask, left, rank_weight)
    return Selection(mask, mask.sum(dim=1), slo_counts)


def _global_top(
    cands: Candidates,
    taken: torch.Tensor,
    budget: torch.Tensor,
    rank_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """[B, N] bool: the `budget` (0-d) best untaken nodes by (f desc, request asc, node asc),
    f scaled by rank_weight [B] where given (per request, so each request's order is kept).
    A stable descending sort of the flattened [B * N] keys ranks them by that rule; the first
    `budget` ranks of real free nodes are taken. Restricted to one request this is a prefix
    of its remaining ranking, so closure is kept. Tensor work only: the budget may come from
    the device."""
    free = cands.valid & ~taken  # [B, N]
    prob = cands.path_prob
    if rank_weight is not None:
        prob = prob * rank_weight.to(prob.device, prob.dtype, non_blocking=True)[:, None]
    key = torch.where(free, prob, -math.inf).flatten()  # [B*N]
    order = torch.sort(key, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(0, order, torch.arange(key.numel(), device=key.device))
    return (free.flatten() & (rank < budget)).view_as(free)
