"""What each draft shape returns (`ShapeGain`): the gain table the cost rule plans from.

Dims: B requests, N candidate nodes per request, S shapes, K node counts; f' is the calibrated
path probability (`accept_calibration`).
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.shapes import beams_of_widths


def draft_widths(max_width: int) -> tuple[int, ...]:
    """The beam widths the planner weighs: every width up to 4, powers of two past it, and the
    maximum itself."""
    widths = {w for w in range(1, max_width + 1) if w <= 4 or w & (w - 1) == 0}
    return tuple(sorted(widths | {max_width}))


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
