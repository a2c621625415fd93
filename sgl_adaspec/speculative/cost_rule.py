"""adaserve's cost rule: how much to speculate, from what speculation returns and costs here.

Pure math (tensors in, numbers out). Dims: B requests, N candidate nodes per request, K the
curve's length. Terms as in `speculative/candidates.py`; f' is the calibrated path probability
(`accept_calibration`), so the expected accepted draft tokens of a set of nodes is their sum of
f' (AdaServe Theorem 3.1 with calibrated probabilities).

Before the draft (`plan_shape`): for every draft shape (d, w) and node count k per request, an
iteration of T = draft ms(d, rows) + verify ms(n (1 + k), context) commits each request of SLO
group g 1 + gain_g(d, w, k) tokens (`ShapeGain`); the objective is how many requests that pace
keeps on course for their SLO (`SloOutlook`), throughput breaking ties. A plain decode is
scored the same way, and no shape may slow a request a plain decode would keep on course below
a plain decode's pace (barring room to spare), so where verifying or drafting costs more than it
returns the plan is depth 0, and where verification is nearly free the full tree wins.
After the draft (`cost_budget`), with the draft paid: the prefix of the batch-wide ranking by
f' that maximizes expected committed tokens per ms.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from sgl_adaspec.scheduler.slo import SloBatch
from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.shapes import beams_of_widths

# verify_ms(tokens, context) / draft_ms(steps, rows) -> float64 latency (broadcast); None
# if unknown.
LatencyFn = Callable[..., torch.Tensor | None]


# `plan_shape`'s tie-break: per request-equivalent, the speed-up over a plain decode's tokens
# per ms; small beside one request kept on course for its SLO.
THROUGHPUT_TIE = 0.01
# A shape may serve a guarded SLO group slower than a plain decode where its pace still
# exceeds what each request a plain decode keeps on course needs, by this many spreads of the
# log wall time (and the switch margin): ~2 % chance for the hardest of them to fall off.
GUARD_SIGMAS = 2.0


def draft_widths(max_width: int) -> tuple[int, ...]:
    """The beam widths the planner weighs: every width up to 4, powers of two past it, and the
    maximum itself."""
    widths = {w for w in range(1, max_width + 1) if w <= 4 or w & (w - 1) == 0}
    return tuple(sorted(widths | {max_width}))


def draft_rows(depth: int | torch.Tensor, width: int | torch.Tensor, requests: int):
    """Tokens through the draft forwards of a depth x width beam for `requests` requests: the
    first step over each root, each later one over the n * w frontier."""
    return requests * (1 + (depth - 1) * width)


def slo_group_keys(tpot_slo_ms: torch.Tensor) -> list[float | None]:
    """[B] TPOT SLOs (NaN: none) -> each request's group key: requests of one SLO (a class)
    share a gain curve. None for best effort."""
    return [None if math.isnan(value) else round(value, 3) for value in tpot_slo_ms.tolist()]


_ALL = "all requests"  # ShapeGain's key of the table over every request
GAIN_CHUNK_NODES = 1 << 15  # nodes of pools per `pooled_gain` call (256 KiB of f')


@dataclass
class ShapeGain:
    """What each draft shape returns: for shape s = (d, w) and k, the expected accepted draft
    tokens per request of k nodes per request spent batch-wide within the beam of depth d and
    width w (`pooled_gain`: a draft's n k best nodes by f' x the selection's rank weight),
    averaged over the requests of the last `drafts` drafts that reached that shape; over all
    requests (`table`) and per SLO group (`group_table`: what the group's requests get of the
    n k best nodes of all), since requests of different classes are accepted differently and
    the batch-wide ranking gives the better-read ones more of the budget.

    The shapes are a grid: depths 1..max_depth, widths `draft_widths(max_width)`, fixed by the
    first draft (the configured search). A draft of shape (D, W) shows every shape (d <= D,
    w <= W): its beam restricted to that shape is the beam a smaller search would have kept.
    Larger shapes are known from the last drafts that reached them (the policy drafts the full
    shape now and then). Within a shape, nodes ranked by f form a prefix closed under parent
    (f never grows from parent to child), so the k best are a tree. Drafts are kept as raw f
    and the tables rebuilt with the current calibration (`refresh`), so an early,
    uncalibrated f does not linger."""

    max_nodes: int = 64
    drafts: int = 8
    # The most requests of a draft it keeps: a sample evenly spread over the batch, from an
    # offset that turns with each draft. The table is a mean per request, and a plan's cost
    # must not grow with the batch.
    max_rows: int = 24
    max_depth: int = 0
    max_width: int = 0
    version: int = 0  # drafts observed
    # After `refresh`: [S, K + 1] float64 (column 0 = 0) over all requests, `reached` [S] bool,
    # and the same table per SLO group (shapes a group's rows never reached copy `table`).
    table: torch.Tensor | None = field(default=None, repr=False)
    reached: torch.Tensor | None = field(default=None, repr=False)
    groups: dict = field(default_factory=dict, repr=False)
    _drafts: deque = field(default_factory=deque, repr=False)  # of _KeptDraft, oldest first
    _grid_of: tuple | None = field(default=None, repr=False)  # (grid key, `grid`)

    @property
    def known(self) -> bool:
        return bool(self._drafts)

    @property
    def shapes(self) -> list[tuple[int, int]]:
        """The grid, width-major: [(1, 1), (2, 1), .., (max_depth, max_width)]."""
        return self.grid()[0]

    def grid(self) -> tuple:
        """What both plans score (`plan_shape`, `speculation_pays`): (`shapes`, node counts
        k [K + 1] = 0..max_nodes, each shape's depth [S, 1] and width [S, 1], float64), built
        once per grid: every plan and every read of a draft reads them."""
        key = (self.max_depth, self.max_width, self.max_nodes)
        if self._grid_of is None or self._grid_of[0] != key:
            widths = draft_widths(self.max_width) if self.max_width else ()
            shapes = [(d, w) for w in widths for d in range(1, self.max_depth + 1)]
            k = torch.arange(self.max_nodes + 1, dtype=torch.float64)
            depth = torch.tensor([d for d, _ in shapes], dtype=torch.float64).unsqueeze(1)
            width = torch.tensor([w for _, w in shapes], dtype=torch.float64).unsqueeze(1)
            self._grid_of = (key, (shapes, k, depth, width))
        return self._grid_of[1]

    def curve(self, depth: int, width: int) -> torch.Tensor | None:
        """[K + 1] of shape (depth, width) over all requests, None if never reached."""
        if self.table is None or (depth, width) not in self.shapes:
            return None
        s = self.shapes.index((depth, width))
        return self.table[s] if bool(self.reached[s]) else None

    def group_table(self, key: float | None) -> torch.Tensor:
        return self.groups.get(key, self.table)

    def observe(
        self,
        cands: Candidates,
        depth: int,
        width: int,
        groups: list[float | None] | None = None,
        rank_weight: torch.Tensor | None = None,
    ) -> None:
        """cands: a draft's candidate trees, a beam of `depth` x `width` (`restrict_to_shape`);
        groups [B]: the requests' `slo_group_keys` (None: one group); rank_weight [B] > 0: the
        weight the selection's throughput phase ranks each request's nodes by (f' x weight,
        `select_adaserve`; None: 1). A request whose every candidate reads f = 0 (blind to
        the draft: `PolicyBase.draft_prefills`) shows nothing of what a shape returns and is
        left out."""
        seen = (cands.path_prob > 0).any(dim=1).cpu()  # [B]
        if not bool(seen.any()):
            return
        if cands.num_requests > self.max_rows:
            stride = -(-cands.num_requests // self.max_rows)
            sample = torch.arange(self.version % stride, cands.num_requests, stride)
            cands, seen = cands.rows(sample.to(cands.path_prob.device)), seen[sample]
            groups = None if groups is None else [groups[i] for i in sample.tolist()]
            if rank_weight is not None:
                rank_weight = rank_weight[sample.to(rank_weight.device)]
            if not bool(seen.any()):
                return
        if not self.max_depth:
            self.max_depth, self.max_width = depth, width
        self.version += 1
        shapes = self.shapes
        f = cands.path_prob.double()
        bsz, nodes = f.shape
        k = min(self.max_nodes, nodes)
        # Per shape and request, its k best nodes by f, and which nodes they are (indices into
        # the flattened [B * N] f, whose extra last entry is 0: the filler of short rows).
        ranked = torch.zeros(len(shapes), bsz, k, dtype=torch.float64)
        node_ids = torch.full((len(shapes), bsz, k), bsz * nodes, dtype=torch.int64)
        reached = torch.tensor([d <= depth and w <= width for d, w in shapes])
        depth_limit = torch.arange(1, depth + 1, device=f.device).view(-1, 1, 1)  # [D, 1, 1]
        offsets = (torch.arange(bsz) * nodes).view(1, -1, 1)
        widths = tuple(w for w in draft_widths(self.max_width) if w <= width)
        beams = _beams_within(cands, depth, width, widths).unsqueeze(1)  # [W, 1, B, N]
        kept = torch.where((cands.depth.unsqueeze(0) <= depth_limit) & beams, f, 0.0)
        top = torch.sort(kept, dim=3, descending=True)  # [W, D, B, N]
        values, indices = top.values[..., :k].cpu(), top.indices[..., :k].cpu() + offsets
        for i, w in enumerate(widths):
            first = shapes.index((1, w))
            ranked[first : first + depth] = values[i]
            node_ids[first : first + depth] = indices[i]
        keys = list(groups) if groups is not None else [None] * bsz
        rows = {key: torch.tensor([k == key for k in keys]) & seen for key in set(keys) - {None}}
        rows = {key: members for key, members in rows.items() if bool(members.any())}
        rows[_ALL] = seen
        # Per group, its pool of nodes per shape, best first, as node indices, cut after the
        # last node with f > 0 (f' of 0 is 0). The calibration is non-decreasing, so it keeps
        # the pool's order: a refresh calibrates each draft's B * N nodes once and sums, and
        # sorts nothing (re-sorting at every plan was most of a plan's time). Pools are kept only
        # for the shapes this draft reached: a planned draft reaches few of the grid's.
        filler = node_ids.new_full((), bsz * nodes)
        ranked, node_ids = ranked[reached], node_ids[reached]
        # Each SLO group's pool is its share of the pool of all requests, not a pool of its
        # own: the selection after the draft ranks the whole batch by f', so a group the draft
        # reads badly gets fewer than k nodes per request, and a per-group pool overpredicts
        # it. The pool of all is ranked as that selection ranks, by f x the request's weight
        # (else the plan overpredicts, and the track record stands speculation down). By raw
        # f, not f': the pool is sorted once and recalibrated unsorted; between requests of
        # different weights the monotone calibration may swap a near tie, a node or so.
        seen_rows = int(seen.sum())
        if rank_weight is not None:
            ranked = ranked * rank_weight.double().cpu().view(1, -1, 1)
        pooled = torch.sort(ranked[:, seen].flatten(1), dim=1, descending=True)
        length = int((pooled.values > 0).sum(dim=1).max())
        ids = node_ids[:, seen].flatten(1).gather(1, pooled.indices[:, :length])
        ids = torch.where(pooled.values[:, :length] > 0, ids, filler)
        owner = torch.div(ids, nodes, rounding_mode="floor")  # [S_r, L]; the filler: row bsz
        pools = {}
        for key, members in rows.items():
            of_group = torch.cat([members, torch.zeros(1, dtype=torch.bool)])
            of_group = of_group.index_select(0, owner.flatten()).view_as(owner)
            pools[key] = (torch.where(of_group, ids, filler), int(members.sum()), seen_rows)
        flat_f = torch.cat([f.flatten().cpu(), torch.zeros(1, dtype=torch.float64)])
        self._drafts.append(_KeptDraft(flat_f, pools, reached))
        while len(self._drafts) > self.drafts:
            self._drafts.popleft()

    def refresh(self, calibrate: Callable[[torch.Tensor], torch.Tensor], fit=None) -> None:
        """Rebuild the tables with `calibrate` (f -> f', monotone, 0 stays 0). `fit` names the
        calibration (None: unnamed): a kept draft's gains computed under the same name are
        reused, so between two fits a refresh computes the new drafts alone."""
        if not self._drafts:
            return
        stale = [draft for draft in self._drafts if fit is None or draft.fit != fit]
        if stale:
            self._compute_gains(stale, calibrate, fit)
        # Per group (an SLO group's key, or _ALL requests): [S, K] gain summed over the rows
        # of the drafts that reached each shape, and those rows [S]; every group in one
        # stack [G, E, S, K], a draft without the group weighed 0 in it.
        drafts = self._drafts
        keys = list(dict.fromkeys(key for draft in drafts for key in draft.pools))
        absent_gain = drafts[0].gains[_ALL].new_zeros(())
        absent_reached = drafts[0].reached.new_zeros(())
        gains, reached_by, counts = [], [], []
        for key in keys:
            for draft in drafts:
                pool = draft.pools.get(key)
                gains.append(absent_gain.expand_as(draft.gains[_ALL]) if pool is None
                             else draft.gains[key])  # fmt: skip
                reached_by.append(absent_reached.expand_as(draft.reached) if pool is None
                                  else draft.reached)  # fmt: skip
                counts.append(0 if pool is None else pool[1])
        num_groups, num_drafts = len(keys), len(drafts)
        gains = torch.stack(gains).view(num_groups, num_drafts, *gains[0].shape)
        weights = torch.stack(reached_by).double().view(num_groups, num_drafts, -1)
        weights = weights * torch.tensor(counts).view(num_groups, num_drafts, 1)  # [G, E, S]
        # Summed draft after draft (cumsum's order, the same sums as one at a time).
        total = (gains * weights.unsqueeze(3)).cumsum(1)[:, -1]  # [G, S, K]
        rows = weights.cumsum(1)[:, -1]  # [G, S]
        everyone = keys.index(_ALL)
        table = _mean_table(total[everyone], rows[everyone])
        reached = rows[everyone] > 0
        means = torch.where((rows > 0).unsqueeze(2), _mean_table(total, rows), table)
        if self.table is not None:
            # A shape no kept draft reached keeps what the drafts that last reached it
            # returned (as last calibrated): else, `drafts` planned drafts after an exploring
            # one, every shape beyond the planned one read as never reached, and the plan
            # could only grow shallower until the next exploration.
            kept = (self.reached & ~reached).unsqueeze(1)
            table = torch.where(kept, self.table, table)
            before = torch.stack([self.groups.get(key, self.table) for key in keys])
            means = torch.where(kept, before, means)
            reached = reached | self.reached
        groups = {key: means[g] for g, key in enumerate(keys) if g != everyone}
        self.table, self.reached, self.groups = table, reached, groups


    def _compute_gains(self, drafts: list, calibrate: Callable, fit) -> None:
        """Each of `drafts`' gains per group under `calibrate`, kept on the draft with `fit`.
        One calibration call for the nodes of them all, then one `pooled_gain` per chunk of
        pools of every group and draft (a pool has one row per shape its draft reached: a
        shape it did not reach gains 0, which `refresh` weighs 0); each pool's node indices
        are shifted to index them all, and every draft's last node (f = 0) pads a short row.
        Chunks: a call is some twenty small torch ops, too many to make per group, while all
        pools in one call outgrow a cache and run slower."""
        drafted = [draft.flat_f for draft in drafts]
        starts = [0, *itertools.accumulate(len(flat_f) for flat_f in drafted)]
        node_f = calibrate(torch.cat(drafted))
        zero = starts[1] - 1  # the first draft's last node
        entries = []  # (pool, (row count, pool rows), draft, group key), draft after draft
        for draft, start in zip(drafts, starts):
            draft.fit, draft.gains = fit, {}
            for key, (pool, count, pool_rows) in draft.pools.items():
                entries.append((pool + start, (count, pool_rows), draft, key))
        chunk, size = [], 0  # pools, until they hold GAIN_CHUNK_NODES nodes or more
        for entry in entries:
            chunk.append(entry)
            size += entry[0].numel()
            if size >= GAIN_CHUNK_NODES:
                self._chunk_gains(chunk, node_f, zero)
                chunk, size = [], 0
        if chunk:
            self._chunk_gains(chunk, node_f, zero)

    def _chunk_gains(self, entries: list, node_f: torch.Tensor, zero: int) -> None:
        """`_compute_gains` for `entries` (pool, (row count, pool rows), draft, group key)."""
        rows = _stacked([pool for pool, _, _, _ in entries], zero)  # [sum of S_r, L]
        lengths = torch.tensor([len(pool) for pool, _, _, _ in entries])
        counts = torch.tensor([counts for _, counts, _, _ in entries])  # [E, 2]
        requests = torch.repeat_interleave(counts[:, 0], lengths)
        pool_rows = torch.repeat_interleave(counts[:, 1], lengths)
        # index_select, not node_f[rows]: the same gather, ~3x faster at ~100k-800k nodes.
        pool = node_f.index_select(0, rows.flatten()).view(len(rows), 1, -1)
        gained = pooled_gain(pool, requests, self.max_nodes, pool_rows)
        reached = torch.stack([draft.reached for _, _, draft, _ in entries])  # [E, S]
        gains = gained.new_zeros(*reached.shape, self.max_nodes)
        gains[reached] = gained[:, 0]  # row-major: the pools' order
        for (_, _, draft, key), gain in zip(entries, gains):
            draft.gains[key] = gain


@dataclass
class _KeptDraft:
    """What `ShapeGain` keeps of one draft: its nodes' raw f [B * N + 1] (the last: 0), per
    group (each SLO group's key, and _ALL) its share of the pool of all requests [S_r, L]
    (node indices, best first, for each of the S_r shapes it reached; the other requests'
    nodes read as the last node, f = 0), its rows R and the pool's rows, the shapes it
    reached [S] bool, and its gains per group [S, K] with the fit they were computed under
    (`ShapeGain.refresh`; none until the first refresh after it)."""

    flat_f: torch.Tensor
    pools: dict
    reached: torch.Tensor
    fit: object = field(default_factory=object)  # matches no fit: computed at the next refresh
    gains: dict | None = None

def _beams_within(
    cands: Candidates, depth: int, width: int, widths: tuple[int, ...]
) -> torch.Tensor:
    """`beams_of_widths(cands, depth, widths)` [W, B, N] for candidates that are already a
    depth x width beam (`restrict_to_shape`): at `width` itself the beam is the candidates,
    so only the narrower widths are searched (none for a chain, the usual planned draft)."""
    if widths and widths[-1] == width:
        narrower = widths[:-1]
        whole = cands.valid.unsqueeze(0)
        if not narrower:
            return whole
        return torch.cat([beams_of_widths(cands, depth, narrower), whole])
    return beams_of_widths(cands, depth, widths)


def pooled_gain(
    pool: torch.Tensor, requests: torch.Tensor, nodes: int, pool_rows: torch.Tensor | None = None
) -> torch.Tensor:
    """pool [E, S, L]: per entry e and shape, the f' of the ranked nodes of a pool of P_e =
    pool_rows[e] requests (default: requests[e]), best first (the nodes past L read 0; nodes
    of requests outside the R_e = requests[e] counted read 0 too) -> [E, S, K = nodes]: for
    k = 1..K, the expected accepted draft tokens per counted request of the pool's P_e * k best
    nodes (a batch-wide budget of k nodes per request, as `cost_budget` spends it). Pooled, not
    each request's own k best: requests the draft reads well take more than k nodes and hard
    ones fewer, which returns more, the more so the deeper the shape; a per-request mean
    under-predicts deep shapes, and the plan would choose too shallow under load."""
    entries, shapes, length = pool.shape
    if length == 0:
        return pool.new_zeros(entries, shapes, nodes)
    k = torch.arange(1, nodes + 1, device=pool.device)
    pool_rows = requests if pool_rows is None else pool_rows
    taken = (k.unsqueeze(0) * pool_rows.unsqueeze(1) - 1).clamp(max=length - 1)  # [E, K]
    best = torch.gather(pool.cumsum(2), 2, taken.unsqueeze(1).expand(-1, shapes, -1))
    return best / requests.view(-1, 1, 1)


def _stacked(pools: list[torch.Tensor], fill: int) -> torch.Tensor:
    """pools [S_e, L_e] each -> [sum of S_e, max L_e], each row padded with `fill`."""
    length = max(pool.shape[1] for pool in pools)
    return torch.cat(
        [torch.cat([pool, pool.new_full((len(pool), length - pool.shape[1]), fill)], 1)
         for pool in pools]
    )  # fmt: skip


def _mean_table(gained: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """gained [..., S, K] (summed with `weight`), weight [..., S] -> [..., S, K + 1] means,
    column 0 = 0."""
    mean = gained / weight.clamp(min=1e-9).unsqueeze(-1)
    return torch.nn.functional.pad(mean, (1, 0))


@dataclass(frozen=True)
class PlanChoice:
    """The plan for the next draft: its shape (depth 0: no speculation), the draft nodes per
    request it expects to verify, and the expected tokens per ms with it and with a plain
    decode (the whole batch's), the objective it maximized for both, and the margin it was
    made with (what more tokens per ms than a plain decode speculation had to promise)."""

    depth: int
    width: int
    nodes_per_request: int
    expected_accepted: float  # per request, bonus included
    tokens_per_ms: float
    plain_tokens_per_ms: float
    iteration_ms: float  # predicted, with the chosen (or best rejected) draft
    plain_ms: float  # predicted, without speculation
    objective: float = 0.0
    plain_objective: float = 0.0
    margin: float = 0.0  # the gain over a plain decode the batch had to expect to switch

    def as_dict(self) -> dict:
        return {
            "depth": self.depth,
            "width": self.width,
            "nodes_per_request": self.nodes_per_request,
            "expected_accepted_per_request": round(self.expected_accepted, 3),
            "tokens_per_ms": round(self.tokens_per_ms, 4),
            "plain_tokens_per_ms": round(self.plain_tokens_per_ms, 4),
            "iteration_ms": round(self.iteration_ms, 3),
            "plain_ms": round(self.plain_ms, 3),
            "speculate": self.depth > 0,
            "required_gain": round(self.margin, 3),
        }


def plan_shape(
    *,
    slo: SloBatch,
    context_tokens: int,
    gain: ShapeGain,
    verify_ms: LatencyFn,
    draft_ms: LatencyFn,
    plain_ms: float,
    margin: float = 0.0,
    guard_margin: float | None = None,
    wall_per_decode: float = 1.0,
    spread: float = 0.0,
    max_width: int | None = None,
) -> PlanChoice | None:
    """Before the draft: the shape (d, w) and node count k per request that keep the most
    running requests on course for their SLO (`SloOutlook`), the most committed tokens per ms
    breaking ties, over every shape `gain` has seen; depth 0 when a plain decode scores at
    least as high. None when a model has no observation yet.

    slo: the running requests' SLO state; plain_ms: a plain iteration's predicted wall time
    (`PolicyBase.plain_latency`); margin: how much more tokens per ms than a plain decode a
    guarded SLO group must expect, unless the batch expects that much and the group
    `guard_margin` (default: `margin`): the switch's hysteresis is the batch's to clear, a
    group's own guard only the plans' prediction error; wall_per_decode, spread:
    `PolicyBase.wall_per_decode` and `.wall_spread` (how uncertain a request's future pace
    is); max_width: the widest beam to choose (None: any), eq. 9's width in the policy.

    A request of group g commits e(s, k) = 1 + its group's gain tokens in an iteration of
    T(s, n (1 + k) verified tokens) ms, while W = T x wall_per_decode passes. The objective
    is the expected count of SLO requests that pace keeps on course, plus `THROUGHPUT_TIE`
    per request-equivalent of speed-up over a plain decode: speed goes to the requests whose
    SLO it decides, not to those far ahead or beyond recovery; the rest is throughput, which
    also drains the queue. A shape is no choice where a guarded group expects fewer tokens
    per ms than a plain decode gives (by `guard_margin`, or `margin` where the batch does
    too), unless it also keeps each request a plain decode would keep on course with room to
    spare (`GUARD_SIGMAS` spreads and the margin in log pace) and speeds up the batch by the
    margin. A group is guarded where a plain decode keeps at least one of its requests on
    course; best-effort groups always are (so a request blind to the draft,
    `SloBatch.draft_blind`, which gains nothing from any shape, holds the plan to a plain
    decode). The draft is priced by its rows: a wide beam must earn back its n * w rows per
    step."""
    n = slo.num_requests
    if gain.table is None or n == 0:
        return None
    shapes, k, depth, width = gain.grid()
    # Only the shapes within `max_width` are scored (under load eq. 9 allows chains alone:
    # a fifth of the grid, and most of the plan's time is the grid's [S, K] terms).
    widest = gain.max_width if max_width is None else max(min(max_width, gain.max_width), 1)
    rows = (width.squeeze(1) <= widest).nonzero().squeeze(1)  # chains always among them
    shapes = [shapes[s] for s in rows.tolist()]
    depth, width, reached = depth[rows], width[rows], gain.reached[rows]
    # No beam holds more than d x w nodes per request: counts past that verify nothing more.
    size = min(gain.max_nodes, gain.max_depth * widest) + 1
    k = k[:size]
    draft = draft_ms(depth, draft_rows(depth, width, n))  # [S, 1]
    if draft is None or verify_ms(torch.tensor([float(n)]), context_tokens) is None:
        return None
    plain_ms = torch.full((1, 1), max(plain_ms, 1e-9))
    plain_wall = plain_ms * wall_per_decode
    keys = slo_group_keys(slo.tpot_slo_ms)
    blind = slo.draft_blind if slo.draft_blind is not None else torch.zeros(n, dtype=torch.bool)
    # Requests blind to the draft (prefilled without it) commit their bonus token alone,
    # whatever the shape: a group of their own within their SLO group.
    groups = []  # (requests, expected tokens [S, K], SloOutlook or None: best effort, guarded)
    plain_kept = 0.0
    log_theta = recovery_log_theta(slo)  # [B], read by every group's outlook
    for key, is_blind in sorted({(key, bool(b)) for key, b in zip(keys, blind.tolist())}, key=str):
        members = torch.tensor([k == key for k in keys]) & (blind == is_blind)
        expected = 1.0 + gain.group_table(key).index_select(0, rows)[:, :size]  # [S, K]
        if is_blind:
            expected = torch.ones_like(expected)
        outlook = None if key is None else SloOutlook.of(slo, members, spread, log_theta)
        guarded = True
        if outlook is not None:
            plain_kept += float(outlook.kept(torch.ones_like(plain_ms), plain_wall).sum())
            guarded = outlook.kept_by(plain_wall)
        groups.append((int(members.sum()), expected, outlook, guarded))

    k_all = k.long().expand(len(shapes), size)  # one count for every group: the selection
    verified = n + n * k_all  # ranks the batch as one
    iteration = (verify_ms(verified.double(), context_tokens) + draft).clamp(min=1e-9)  # [S, K]
    wall = iteration * wall_per_decode
    kept = torch.zeros_like(iteration)
    committed = torch.zeros_like(iteration)
    for count, expected, _, _ in groups:
        committed += count * expected
    speedup = committed / iteration * (plain_ms / n)  # over a plain decode's tokens per ms
    # A guarded group may be served slower than a plain decode only where the shape still keeps
    # on course, with room to spare, each request a plain decode keeps, and speeds up the batch
    # by the margin (which holds the plans' track record).
    may_slow = speedup >= 1.0 + margin
    headroom = GUARD_SIGMAS * spread + math.log1p(margin)
    guard_margin = margin if guard_margin is None else min(guard_margin, margin)
    slows_guarded = torch.zeros_like(iteration, dtype=torch.bool)
    for _, expected, outlook, guarded in groups:
        if guarded:
            rate = expected / iteration  # tokens per ms of each request of the group
            # Short of the margin where the batch is too, or short of the group's own margin.
            short_of_switch = (rate < (1.0 + margin) / plain_ms) & ~may_slow
            short_of_guard = rate < (1.0 + guard_margin) / plain_ms
            if outlook is not None:
                keeps = outlook.keeps_what_plain_keeps(expected, wall, plain_wall, headroom)
                short_of_guard &= ~(keeps & may_slow)
            slows_guarded |= short_of_switch | short_of_guard
        if outlook is not None:
            kept += outlook.kept(expected, wall)
    objective = kept + THROUGHPUT_TIE * speedup
    # A draft with no node verified is never better than a plain decode.
    objective[(verified == n) | ~reached.unsqueeze(1)] = -1.0
    # No request a plain decode keeps on its SLO is slowed for others, barring room to spare.
    objective[slows_guarded] = -1.0
    best, count = divmod(int(objective.argmax()), size)
    d, w = shapes[best]
    nodes = count * n
    score = float(objective[best, count])
    tokens, ms = float(committed[best, count]), float(iteration[best, count])
    plain = float(plain_ms)
    if score < 0:
        # No allocation is a choice: report the draft that comes nearest (the most committed
        # tokens per ms), not one that verifies nothing. Reported only: a plan that stands
        # down is used for its plain price.
        rate = committed / iteration
        rate[:, 0] = -math.inf
        rate[~reached] = -math.inf
        if float(rate.max()) > -math.inf:
            nearest, nearest_count = divmod(int(rate.argmax()), size)
            d, w = shapes[nearest]
            nodes = nearest_count * n
            tokens = float(committed[nearest, nearest_count])
            ms = float(iteration[nearest, nearest_count])
    choice = PlanChoice(
        d, w, round(nodes / n), tokens / n, tokens / ms, n / plain, ms, plain, score,
        plain_kept + THROUGHPUT_TIE, margin,
    )  # fmt: skip
    if choice.objective <= choice.plain_objective:
        return dataclasses.replace(choice, depth=0, nodes_per_request=0)
    return choice


def speculation_pays(
    *,
    gain: ShapeGain,
    loads: torch.Tensor,
    context_per_request: int,
    verify_ms: LatencyFn,
    draft_ms: LatencyFn,
    plain_ms: torch.Tensor | None,
) -> torch.Tensor:
    """loads [L]: running requests n; plain_ms [L]: a plain decode's price at each (None: not
    measured) -> [L] bool: whether some shape commits more tokens per ms for each of n
    requests (each at `context_per_request`) than a plain decode at n. The plan guards each
    request's speed, so where this is false at every load a batch reaches, no plan
    speculates: it decides whether a stand-down keeps the draft's state (at one request,
    `AdaservePolicy.keep_draft_warm`) and whether new requests are prefilled with the draft
    (`AdaservePolicy.draft_prefills`). True where a model has no observation yet (the gain is
    still to be learned, from a draft whose state was kept)."""
    loads = torch.as_tensor(loads, dtype=torch.float64)
    unknown = torch.ones(loads.shape, dtype=torch.bool)
    if gain.table is None or plain_ms is None:
        return unknown
    _, k, depth, width = gain.grid()
    n = loads.view(-1, 1, 1)  # [L, 1, 1]
    verify = verify_ms(n * (1 + k), n * context_per_request)  # [L, 1, K]
    draft = draft_ms(depth, draft_rows(depth, width, n))  # [L, S, 1]
    if verify is None or draft is None:
        return unknown
    rate = (1.0 + gain.table) / (verify + draft).clamp(min=1e-9)  # [L, S, K] per request
    rate[..., 0] = 0.0  # a draft with nothing verified is never better than a plain decode
    rate[:, ~gain.reached] = 0.0
    plain = torch.as_tensor(plain_ms, dtype=torch.float64)
    return (rate.amax(dim=(1, 2)) * plain > 1.0) | (plain <= 0)


@dataclass(frozen=True)
class SloOutlook:
    """Which of one SLO group's requests an iteration keeps on course for their SLO. A request
    of TPOT SLO t that has committed o tokens in l ms of decoding (q = l / (o t): its TPOT so
    far over its SLO; 1 before its first token) ends within its SLO if it commits as many
    tokens again at no more than (2 - q) t ms each. An iteration whose wall time W (stalls
    included) commits it e tokens sets that pace if rho = e t / W >= theta = 1 / (2 - q); a
    request at twice its SLO or past it (q >= 2) is beyond recovery over that horizon. Later
    iterations' pace is uncertain: with the measured spread sigma of the log wall time of
    iterations, a request counts Phi(log(rho / theta) / sigma), 1 or 0 at sigma = 0.
    Per SLO of the group (SLOs within `slo_group_keys`' rounding): tpot, and the requests'
    log theta [R_t] sorted (inf: beyond recovery)."""

    spread: float
    per_slo: tuple[tuple[float, torch.Tensor], ...]

    @classmethod
    def of(
        cls, slo: SloBatch, members: torch.Tensor, spread: float,
        log_theta: torch.Tensor | None = None,
    ) -> SloOutlook:  # fmt: skip
        """The group of `slo`'s requests `members` [B] bool; log_theta [B]: the batch's
        `recovery_log_theta`, where the caller computed it for several groups."""
        if log_theta is None:
            log_theta = recovery_log_theta(slo)
        per_slo = []
        for tpot in sorted(set(slo.tpot_slo_ms[members].tolist())):
            rows = members & (slo.tpot_slo_ms == tpot)
            per_slo.append((tpot, torch.sort(log_theta[rows]).values))
        return cls(spread, tuple(per_slo))

    def kept(self, expected: torch.Tensor, wall_ms: torch.Tensor) -> torch.Tensor:
        """expected [S, K]: tokens an iteration commits for each request of the group while
        wall_ms [S, K] pass (the iteration and its stalls) -> [S, K]: the group's requests it
        keeps on course (expected count)."""
        total = 0.0
        for tpot, log_theta in self.per_slo:
            log_rho = _log_pace(expected, tpot, wall_ms).contiguous()
            if self.spread > 0:
                z = (log_rho.unsqueeze(-1) - log_theta) / self.spread  # [S, K, R_t]
                total = total + torch.special.ndtr(z).sum(-1)
            else:
                total = total + torch.searchsorted(log_theta, log_rho, right=True).double()
        return total

    def keeps_what_plain_keeps(
        self, expected: torch.Tensor, wall_ms: torch.Tensor, plain_wall_ms: torch.Tensor,
        headroom: float,
    ) -> torch.Tensor:  # fmt: skip
        """expected, wall_ms [S, K] as in `kept` -> [S, K] bool: whether that pace keeps on
        course every request of the group that a plain decode (one token per `plain_wall_ms`
        [1, 1]) keeps, each with `headroom` to spare in log pace."""
        keeps = torch.ones_like(expected, dtype=torch.bool)
        for tpot, log_theta in self.per_slo:
            kept_by_plain = log_theta[log_theta <= _log_pace(1.0, tpot, plain_wall_ms)]
            if kept_by_plain.numel() == 0:
                continue
            keeps &= _log_pace(expected, tpot, wall_ms) >= float(kept_by_plain[-1]) + headroom
        return keeps

    def kept_by(self, plain_wall_ms: torch.Tensor) -> bool:
        """Whether a plain decode (one token per `plain_wall_ms` [1, 1]) keeps at least one
        of the group's requests on course."""
        return any(
            bool(log_theta[0] <= _log_pace(1.0, tpot, plain_wall_ms))
            for tpot, log_theta in self.per_slo
        )


def _log_pace(expected, tpot: float, wall_ms):
    """log rho (`SloOutlook`): the pace of `expected` tokens per `wall_ms` against an SLO of
    `tpot` ms per token; a tensor for tensors, a float for a plain decode's numbers."""
    if isinstance(expected, torch.Tensor):
        return torch.log((expected * tpot / wall_ms).clamp(min=1e-12))
    return math.log(expected * tpot / float(wall_ms))


def recovery_log_theta(slo: SloBatch) -> torch.Tensor:
    """[B] float64: each request's log theta (`SloOutlook`), inf past recovery or without an
    SLO."""
    ratio = slo.tpot_ratio
    return torch.where(ratio < 2.0, -torch.log((2.0 - ratio).clamp(min=1e-9)), math.inf)


def cost_budget(
    calibrated: torch.Tensor,
    valid: torch.Tensor,
    sunk_ms: float,
    context_tokens: int,
    verify_ms: LatencyFn,
) -> torch.Tensor | None:
    """After the draft (its `sunk_ms` already paid): the verify budget B, roots included, that
    maximizes expected committed tokens per ms over the batch-wide ranking by f', as a 0-d
    int64 tensor on the draft's device (tensor work only: no host read between the draft and
    the verify). calibrated [B, N] f'; valid [B, N] bool. None when the verify model has no
    observation."""
    n = calibrated.shape[0]
    f = torch.where(valid, calibrated, -1.0).double().flatten()
    ranked = torch.sort(f, descending=True).values  # [M] valid nodes first, best first
    m = torch.arange(0, ranked.numel() + 1, dtype=torch.float64, device=f.device)  # [M + 1]
    zero = torch.zeros(1, dtype=torch.float64, device=f.device)
    expected = n + torch.cat([zero, ranked.clamp(min=0.0).cumsum(0)])
    verify = verify_ms(n + m, context_tokens)
    if verify is None:
        return None
    rate = expected / (sunk_ms + verify).clamp(min=1e-9)
    # Only prefixes of real nodes: past the last one the count m would buy nothing.
    rate = torch.where(m <= valid.sum(), rate, -math.inf)
    return n + torch.argmax(rate)  # argmax: the first (smallest) best prefix
