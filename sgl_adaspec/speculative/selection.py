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
import functools
import math
from dataclasses import dataclass

import torch

from sgl_adaspec.scheduler.slo import capped_required
from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.host_copy import to_device, to_dtype, to_host
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
    - serve_key [B] int64: the SLO phase's order (A(r) desc, ties by index) as a key above
      every throughput key (f x rank_weight <= 1): B + 1 for the first request served down to
      2 for the last. The selection ranks each request's SLO-phase nodes at its key, so one
      batch-wide sort serves the requests in this order until the budget runs out;
    - rank_weight [B] float in (0, 1] or None: the throughput phase's weight on f (None: f
      alone);
    - drop_beyond_reach: serve A(r) = 0 to the requests whose whole tree, accepted as f
      expects, commits less than A(r), known only from the draft. The order stands: a request
      that asks for nothing is granted nothing wherever it is served;
    - asks_past_the_bonus: some A(r) > 1. Where none is (read on the host, with the demand),
      the bonus token meets every A(r) and the SLO phase has nothing to add.
    """

    required: torch.Tensor
    serve_key: torch.Tensor
    rank_weight: torch.Tensor | None = None
    drop_beyond_reach: bool = False
    asks_past_the_bonus: bool = True

    @classmethod
    def of(
        cls,
        required: torch.Tensor,
        rank_weight: torch.Tensor | None = None,
        drop_beyond_reach: bool = False,
    ) -> Demand:
        _check_required(required)
        if rank_weight is not None and (
            rank_weight.shape != required.shape
            or (
                free_to_read(rank_weight)
                and not bool(((rank_weight > 0) & (rank_weight <= 1)).all())
            )
        ):
            raise ValueError(
                f"rank_weight must be [B] = [{required.shape[0]}] in (0, 1], got {rank_weight}"
            )
        num_requests = len(required)
        urgency = torch.sort(required, descending=True, stable=True).indices
        keys_in_order = torch.arange(num_requests + 1, 1, -1, device=urgency.device)
        serve_key = torch.empty_like(urgency).scatter_(0, urgency, keys_in_order)
        # Unknown where A(r) lives on the device: the SLO phase then runs.
        asks = not free_to_read(required) or bool((required > 1.0).any())
        return cls(required, serve_key, rank_weight, drop_beyond_reach, asks)

    def to(self, device: torch.device) -> Demand:
        """The same demand on `device`, by copies that do not wait on the device."""
        if self.required.device == device:
            return self
        weight = self.rank_weight
        return Demand(
            *(t.to(device, non_blocking=True) for t in (self.required, self.serve_key)),
            None if weight is None else weight.to(device, non_blocking=True),
            self.drop_beyond_reach, self.asks_past_the_bonus,
        )  # fmt: skip


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
       those not yet selected (by f x rank_weight[r], [B] in (0, 1], where given).
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
    runs between the draft and its verify (`select_within`)."""
    _check_budget(budget)
    spare = budget - cands.num_requests
    spare = spare.clamp(min=0) if isinstance(spare, torch.Tensor) else max(spare, 0)
    return select_within(cands, demand, spare, max_nodes_per_request)


def select_within(
    cands: Candidates,
    demand: Demand,
    draft_budget: int | torch.Tensor,
    max_nodes_per_request: int | torch.Tensor,
    min_key: float | None = -math.inf,
) -> Selection:
    """`select_for_demand` with the budget given as the candidate nodes to verify beside the
    roots: draft_budget >= 0, an int or a 0-d int64 on the candidates' device. A node is
    taken only with a key above `min_key` (-inf: any real node; 0: only nodes some
    acceptance is expected of; None: the caller knows the budget buys no node at or below
    0, as `planner.cost_budget`'s, so the selection need not check).
    Worked in rank order (each request's nodes by f desc, `_rank_nodes`), where both phases
    take prefixes, and put back in node order once."""
    num_requests = cands.num_requests
    _check_shape(demand.required, num_requests)
    for name, count in (("max_nodes_per_request", max_nodes_per_request),
                        ("draft_budget", draft_budget)):  # fmt: skip
        if isinstance(count, int) and count < 0:
            raise ValueError(f"{name} must be >= 0, got {count}")
    device = cands.valid.device
    demand = demand.to(device)
    weight = demand.rank_weight
    if not demand.asks_past_the_bonus:  # phase 1 adds nothing: no ranking per request
        return _finish(None, _node_keys(cands), draft_budget, weight, min_key=min_key)
    order, ranked = _rank_nodes(cands)  # [B, N], padding -inf
    # Phase 1 for one request is "take its ranked nodes while n_acc < A_cap": n_acc before the
    # k-th node is 1 + (sum of the first k f's), non-decreasing in k, so the nodes taken form a
    # prefix whose length is the number of real k with n_acc_before[k] < A_cap.
    acc = _acc_before(ranked.clamp(min=0.0))  # [B, N + 1]: the last, n_acc of the whole tree
    target = capped_required(demand.required, cands.max_depth)  # [B] A_cap
    if demand.drop_beyond_reach:
        # n_acc >= 1: a target of 0 takes nothing. The others' A_cap is at most n_acc of the
        # whole tree, which padding ranks hold.
        target = torch.where(demand.required <= acc[:, -1], target, 0.0)
        wanted = acc[:, :-1] < target[:, None]  # [B, N] in rank order
    else:
        wanted = (acc[:, :-1] < target[:, None]) & (ranked >= 0)  # real nodes: f >= 0
    if isinstance(max_nodes_per_request, torch.Tensor):
        max_nodes_per_request = to_device(max_nodes_per_request, device)
    # Each request asks for its prefix; the batch-wide ranking serves the asks in the SLO
    # phase's order until the budget runs out (`Demand.serve_key`).
    asked = wanted.sum(dim=1).clamp(max=max_nodes_per_request)  # [B]
    return _finish(
        order, ranked, draft_budget, weight, (asked, demand.serve_key), min_key=min_key
    )


def optimal_trees(cands: Candidates, required: torch.Tensor, budget: int) -> Selection | Infeasible:
    """AdaServe Algorithm 1 on the given candidate trees: the optimal trees, or INVALID.

    Maximizes sum_r E[acc(T_r)] subject to E[acc(T_r)] >= A(r) for every r and
    sum_r |T_r| <= budget (roots included), over subtrees of the candidate trees. Step 1 gives
    each request the fewest top-f nodes that reach A(r) (uncapped, no n_max); step 2 spends the
    rest on the batch-wide top nodes by f. INVALID when budget < B, when a request's whole tree
    cannot reach A(r), or when the step-1 needs exceed the budget.
    """
    num_requests = _check_inputs(cands, required, budget)
    if budget < num_requests:
        return Infeasible.INVALID
    order, ranked = _rank_nodes(cands)
    acc = _acc_before(ranked.clamp(min=0.0))  # [B, N + 1]: the last, n_acc of the whole tree
    if bool((acc[:, -1] < required).any()):
        return Infeasible.INVALID
    need = ((acc[:, :-1] < required[:, None]) & (ranked >= 0)).sum(dim=1)  # [B]
    draft_budget = budget - num_requests
    if int(need.sum()) > draft_budget:
        return Infeasible.INVALID
    # Every need fits the budget: the order they are served in does not matter.
    prefixes = (need, Demand.of(required).serve_key)
    return _finish(order, ranked, draft_budget, prefixes=prefixes)


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


def _check_inputs(cands: Candidates, required: torch.Tensor, budget: int) -> int:
    num_requests = cands.num_requests
    _check_shape(required, num_requests)
    _check_required(required)
    _check_budget(budget)
    return num_requests


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

    Returns order [B, N] int64 (node index at each rank) and ranked [B, N] (f at each rank,
    -inf for padding).
    """
    # A stable descending sort keeps equal keys in index order: the (f desc, index asc) rule.
    ranked, order = torch.sort(_node_keys(cands), dim=1, descending=True, stable=True)
    return order, ranked


def _node_keys(cands: Candidates) -> torch.Tensor:
    """[B, N]: f in node order, -inf for padding (ranks after every real node)."""
    return torch.where(cands.valid, cands.path_prob, -math.inf)


def _acc_before(sorted_prob: torch.Tensor) -> torch.Tensor:
    """[B, N + 1]: n_acc before the node at rank k is added, i.e. 1 + sum of the first k f's
    (sorted_prob [B, N] >= 0 in rank order); column N is n_acc with every node.

    Summed left to right starting from 1.0, as Algorithm 2's n_acc += f(v) does (bit for bit
    on CPU; a parallel scan on GPU may round differently in the last place).
    """
    return torch.nn.functional.pad(sorted_prob, (1, 0), value=1.0).cumsum(dim=1)


def _prefix_mask(order: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """[B, N] bool in node order: the first lengths[b] ranked nodes of each request."""
    in_prefix = _positions(order.shape[1], order.device) < lengths[:, None]  # [B, N] by rank
    return torch.zeros_like(in_prefix).scatter_(1, order, in_prefix)


def _finish(
    order: torch.Tensor | None,
    ranked: torch.Tensor,
    draft_budget: int | torch.Tensor,
    rank_weight: torch.Tensor | None = None,
    prefixes: tuple[torch.Tensor, torch.Tensor] | None = None,
    min_key: float | None = -math.inf,
) -> Selection:
    """The phase-1 prefixes, then the batch-wide top of the rest by f (x rank_weight [B]) up to
    `draft_budget` (an int or 0-d) nodes in all; order and ranked [B, N] from `_rank_nodes`
    (order None: ranked is f in node order, -inf for padding, and no prefixes). prefixes: (counts [B], the
    requests' `Demand.serve_key` [B]): each request's first counts ranks rank at its serve key,
    above every other key, so the requests are served in that order and the last one served is
    cut where the budget ends; then the rest by key; the first `draft_budget` ranks are taken,
    those with a key above `min_key` (-inf: real ones; None: not checked).
    Flattened, the order is (request, rank) or (request, node), and equal keys within a request
    rank by node index: the module's rule either way. Restricted to one request this is a
    prefix of its ranking, so closure is kept. Tensor work only: the budget may come from the
    device."""
    num_requests, num_nodes = ranked.shape
    device = ranked.device
    key = ranked
    if rank_weight is not None:
        key = key * to_dtype(rank_weight, key.dtype)[:, None]  # w > 0: -inf stays -inf
    if prefixes is not None:
        prefix_counts, serve_key = prefixes
        in_prefix = _positions(num_nodes, device) < prefix_counts[:, None]  # [B, N]
        # An integer key above every f x w <= 1, promoted to the key's dtype.
        key = torch.where(in_prefix, serve_key[:, None], key)
    key = key.flatten()  # [B*N]
    top_key, top = torch.sort(key, descending=True, stable=True)
    taken = _positions(key.numel(), device) < draft_budget
    if min_key is not None:
        taken &= top_key > min_key
    taken_ranked = torch.empty_like(taken).scatter_(0, top, taken).view(num_requests, num_nodes)
    counts = taken_ranked.sum(dim=1)
    if order is None:
        return Selection(taken_ranked, counts, torch.zeros_like(counts))
    mask = torch.empty_like(taken_ranked).scatter_(1, order, taken_ranked)  # node order
    # A request's nodes taken are a prefix of its ranking: its prefix, as far as it was served.
    slo_counts = torch.minimum(prefixes[0], counts)
    return Selection(mask, counts, slo_counts)


def _positions(count: int, device: torch.device | None = None) -> torch.Tensor:
    """arange(count) [count] int64 on `device`; on the host made once (one operation fewer
    between the draft and the verify), on a device each time: a tensor kept from inside a
    CUDA graph's capture would hold nothing until the graph replays."""
    if device is None or device.type == "cpu":
        return _host_positions(count)
    return torch.arange(count, device=device)


@functools.lru_cache(maxsize=64)
def _host_positions(count: int) -> torch.Tensor:
    with torch.inference_mode(False):  # read-only, used inside and outside inference mode
        return torch.arange(count)
