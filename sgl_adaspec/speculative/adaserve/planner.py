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
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from sgl_adaspec.scheduler.slo import SloBatch
from sgl_adaspec.speculative.adaserve.gain_table import ShapeGain, slo_group_keys
from sgl_adaspec.speculative.shapes import draft_rows

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
