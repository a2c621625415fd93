"""What each draft shape returns (`ShapeGain`): the gain table the cost rule plans from.
Dims: B requests, N nodes per request, S shapes, K node counts; f' is the calibrated f."""

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
    """Every width up to 4, powers of two past it, and the maximum itself."""
    widths = {w for w in range(1, max_width + 1) if w <= 4 or w & (w - 1) == 0}
    return tuple(sorted(widths | {max_width}))


def slo_group_keys(tpot_slo_ms: torch.Tensor) -> list[float | None]:
    """[B] TPOT SLOs -> each request's group key (None: best effort)."""
    return [None if math.isnan(value) else round(value, 3) for value in tpot_slo_ms.tolist()]


_ALL = "all requests"
GAIN_CHUNK_NODES = 1 << 15  # nodes of pools per `pooled_gain` call


@dataclass
class ShapeGain:
    """For shape (d, w) and k nodes per request spent batch-wide (`pooled_gain`), the expected
    accepted draft tokens per request, over the last `drafts` drafts that reached the shape:
    over all requests (`table`) and per SLO group (`group_table`). A draft of shape (D, W)
    shows every smaller shape: its beam restricted to one is what a smaller search keeps.
    Drafts are kept as raw f and recalibrated at `refresh`, so an early f does not linger."""

    max_nodes: int = 64
    drafts: int = 8
    # Requests kept per draft, evenly spread: a plan's cost must not grow with the batch.
    max_rows: int = 24
    max_depth: int = 0
    max_width: int = 0
    version: int = 0  # drafts observed
    # After `refresh`: [S, K + 1] (column 0 = 0), `reached` [S] bool, and a table per group.
    table: torch.Tensor | None = field(default=None, repr=False)
    reached: torch.Tensor | None = field(default=None, repr=False)
    groups: dict = field(default_factory=dict, repr=False)
    _drafts: deque = field(default_factory=deque, repr=False)  # of _KeptDraft, oldest first
    _grid_of: tuple | None = field(default=None, repr=False)

    @property
    def known(self) -> bool:
        return bool(self._drafts)

    @property
    def shapes(self) -> list[tuple[int, int]]:
        """Width-major: [(1, 1), (2, 1), .., (max_depth, max_width)]."""
        return self.grid()[0]

    def grid(self) -> tuple:
        """(`shapes`, k [K + 1] = 0..max_nodes, depth [S, 1], width [S, 1]), built once."""
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
        """[K + 1] over all requests, None if never reached."""
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
        """cands: a depth x width beam; groups [B]: `slo_group_keys`; rank_weight [B]: what the
        selection ranks nodes by besides f. Requests blind to the draft (f = 0) are left out."""
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
        # Per shape and request, its k best f and their indices into the flat f (filler: B * N).
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
        # Pools are sorted once, by raw f: the calibration is monotone, so a refresh sorts
        # nothing (re-sorting was most of a plan's time).
        filler = node_ids.new_full((), bsz * nodes)
        ranked, node_ids = ranked[reached], node_ids[reached]
        # A group's pool is its share of the pool of all, ranked as the selection ranks the
        # whole batch: a group the draft reads badly gets fewer nodes, not k each.
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
        """Rebuild the tables with `calibrate` (monotone, 0 stays 0); a draft's gains under the
        same `fit` name are reused."""
        if not self._drafts:
            return
        stale = [draft for draft in self._drafts if fit is None or draft.fit != fit]
        if stale:
            self._compute_gains(stale, calibrate, fit)
        # Every group in one stack [G, E, S, K], a draft without the group weighed 0.
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
        total = (gains * weights.unsqueeze(3)).cumsum(1)[:, -1]  # [G, S, K]
        rows = weights.cumsum(1)[:, -1]  # [G, S]
        everyone = keys.index(_ALL)
        table = _mean_table(total[everyone], rows[everyone])
        reached = rows[everyone] > 0
        means = torch.where((rows > 0).unsqueeze(2), _mean_table(total, rows), table)
        if self.table is not None:
            # A shape no kept draft reached keeps its last table: else the plan could only
            # grow shallower until the next exploring draft.
            kept = (self.reached & ~reached).unsqueeze(1)
            table = torch.where(kept, self.table, table)
            before = torch.stack([self.groups.get(key, self.table) for key in keys])
            means = torch.where(kept, before, means)
            reached = reached | self.reached
        groups = {key: means[g] for g, key in enumerate(keys) if g != everyone}
        self.table, self.reached, self.groups = table, reached, groups

    def _compute_gains(self, drafts: list, calibrate: Callable, fit) -> None:
        """Each of `drafts`' gains per group under `calibrate`: one calibration call, then one
        `pooled_gain` per chunk of pools (per group, a call is too many small ops; all in one
        outgrows a cache)."""
        drafted = [draft.flat_f for draft in drafts]
        starts = [0, *itertools.accumulate(len(flat_f) for flat_f in drafted)]
        node_f = calibrate(torch.cat(drafted))
        zero = starts[1] - 1  # the first draft's last node
        entries = []  # (pool, (row count, pool rows), draft, group key)
        for draft, start in zip(drafts, starts):
            draft.fit, draft.gains = fit, {}
            for key, (pool, count, pool_rows) in draft.pools.items():
                entries.append((pool + start, (count, pool_rows), draft, key))
        chunk, size = [], 0
        for entry in entries:
            chunk.append(entry)
            size += entry[0].numel()
            if size >= GAIN_CHUNK_NODES:
                self._chunk_gains(chunk, node_f, zero)
                chunk, size = [], 0
        if chunk:
            self._chunk_gains(chunk, node_f, zero)

    def _chunk_gains(self, entries: list, node_f: torch.Tensor, zero: int) -> None:
        rows = _stacked([pool for pool, _, _, _ in entries], zero)  # [sum of S_r, L]
        lengths = torch.tensor([len(pool) for pool, _, _, _ in entries])
        counts = torch.tensor([counts for _, counts, _, _ in entries])  # [E, 2]
        requests = torch.repeat_interleave(counts[:, 0], lengths)
        pool_rows = torch.repeat_interleave(counts[:, 1], lengths)
        # index_select: the same gather as node_f[rows], ~3x faster.
        pool = node_f.index_select(0, rows.flatten()).view(len(rows), 1, -1)
        gained = pooled_gain(pool, requests, self.max_nodes, pool_rows)
        reached = torch.stack([draft.reached for _, _, draft, _ in entries])  # [E, S]
        gains = gained.new_zeros(*reached.shape, self.max_nodes)
        gains[reached] = gained[:, 0]  # row-major: the pools' order
        for (_, _, draft, key), gain in zip(entries, gains):
            draft.gains[key] = gain


@dataclass
class _KeptDraft:
    """One draft: raw f [B * N + 1] (the last: 0), per group (pool [S_r, L] of node indices,
    rows, pool rows), the shapes it reached [S], and its gains per group under `fit`."""

    flat_f: torch.Tensor
    pools: dict
    reached: torch.Tensor
    fit: object = field(default_factory=object)  # matches no fit until computed
    gains: dict | None = None


def _beams_within(
    cands: Candidates, depth: int, width: int, widths: tuple[int, ...]
) -> torch.Tensor:
    """`beams_of_widths` [W, B, N] of a depth x width draft: at `width` itself every candidate
    (what the selection of that draft takes from: on a server, leaves its beam did not keep
    too), so only narrower widths are searched."""
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
    """pool [E, S, L]: ranked f' of a pool of pool_rows[e] requests (default: requests[e]) ->
    [E, S, nodes]: per counted request, the gain of the pool's pool_rows * k best nodes, as
    the selection spends the plan's batch-wide budget. Per request, deep shapes would be
    underpriced."""
    entries, shapes, length = pool.shape
    if length == 0:
        return pool.new_zeros(entries, shapes, nodes)
    k = torch.arange(1, nodes + 1, device=pool.device)
    pool_rows = requests if pool_rows is None else pool_rows
    taken = (k.unsqueeze(0) * pool_rows.unsqueeze(1) - 1).clamp(max=length - 1)  # [E, K]
    best = torch.gather(pool.cumsum(2), 2, taken.unsqueeze(1).expand(-1, shapes, -1))
    return best / requests.view(-1, 1, 1)


def _stacked(pools: list[torch.Tensor], fill: int) -> torch.Tensor:
    length = max(pool.shape[1] for pool in pools)
    return torch.cat(
        [torch.cat([pool, pool.new_full((len(pool), length - pool.shape[1]), fill)], 1)
         for pool in pools]
    )  # fmt: skip


def _mean_table(gained: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    mean = gained / weight.clamp(min=1e-9).unsqueeze(-1)
    return torch.nn.functional.pad(mean, (1, 0))
