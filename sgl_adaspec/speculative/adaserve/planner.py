"""adaserve's cost rule: how much to speculate, from what speculation returns and costs here.
Pure math. f' is the calibrated path probability: a set of nodes is expected to commit their
sum of f' (AdaServe Theorem 3.1).

Before the draft, `plan_shape` scores every shape and node count, and a plain decode, by the
requests kept on course for their SLO: the draft runs the chosen shape and the verify takes
the chosen count. After a draft no plan shaped (a probe, an exploration), `cost_budget` cuts
the batch-wide ranking by f' where expected tokens per ms peak.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from sgl_adaspec.scheduler.slo import SloBatch
from sgl_adaspec.speculative.adaserve.gain_table import ShapeGain, slo_group_keys
from sgl_adaspec.speculative.host_copy import to_device, to_dtype
from sgl_adaspec.speculative.latency import TokensCurve
from sgl_adaspec.speculative.shapes import draft_rows

# verify_ms(tokens, context) / draft_ms(steps, rows) -> latency (broadcast); None if unknown.
LatencyFn = Callable[..., torch.Tensor | None]


# The tie-break per request-equivalent of speed-up: small beside one request kept on course.
THROUGHPUT_TIE = 0.01


@dataclass(frozen=True)
class PlanChoice:
    """The plan for the next draft (depth 0: no speculation), with the batch's expected tokens
    per ms with it and with a plain decode."""

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
    margin: float = 0.0  # the edge over a plain decode the batch had to expect

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
    """The shape (d, w) and nodes per request k that keep the most requests on course for
    their SLO (`SloOutlook`), throughput breaking ties; depth 0 where a plain decode scores as
    high; None while a model is unfitted. An iteration of T ms commits each request of group g
    1 + gain_g tokens, over T x wall_per_decode of wall time.

    A shape may not slow a guarded group (one a plain decode keeps a request of on course, or
    best effort) below a plain decode's pace by `guard_margin` (`margin` where the batch is
    short of it too), unless it keeps every request a plain decode keeps on course with
    `margin` to spare in its pace and speeds up the batch by `margin`. Speed so goes to the
    requests whose SLO it decides, and a request blind to the draft holds the plan to a plain
    decode."""
    n = slo.num_requests
    if gain.table is None or n == 0:
        return None
    shapes, k, depth, width = gain.grid()
    # Only shapes within `max_width`: most of the plan's time is the grid's [S, K] terms.
    widest = gain.max_width if max_width is None else max(min(max_width, gain.max_width), 1)
    rows = (width.squeeze(1) <= widest).nonzero().squeeze(1)  # chains always among them
    shapes = [shapes[s] for s in rows.tolist()]
    depth, width, reached = depth[rows], width[rows], gain.reached[rows]
    size = min(gain.max_nodes, gain.max_depth * widest) + 1
    k = k[:size]
    draft = draft_ms(depth, draft_rows(depth, width, n))  # [S, 1]
    if draft is None or verify_ms(torch.tensor([float(n)]), context_tokens) is None:
        return None
    plain_ms = torch.full((1, 1), max(plain_ms, 1e-9))
    plain_wall = plain_ms * wall_per_decode
    keys = slo_group_keys(slo.tpot_slo_ms)
    blind = slo.draft_blind if slo.draft_blind is not None else torch.zeros(n, dtype=torch.bool)
    # Requests blind to the draft commit one token whatever the shape: a group of their own.
    groups = []  # (requests, expected tokens [S, K], outlook (None: best effort), guarded)
    plain_kept = 0.0
    log_theta = recovery_log_theta(slo)
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
    speedup = committed / iteration * (plain_ms / n)
    may_slow = speedup >= 1.0 + margin
    # The room a shape slowing a guarded group leaves each request a plain decode keeps on
    # course: the margin, not spreads of one iteration's wall time. The SLO is a request's
    # mean pace over its iterations, and under load prefill stalls spread the iterations
    # (sigma ~1): two spreads asked a pace ~7x what the request needs, so a few relaxed
    # requests held a loaded batch plain where speculation doubled its tokens per ms.
    headroom = math.log1p(margin)
    guard_margin = margin if guard_margin is None else min(guard_margin, margin)
    slows_guarded = torch.zeros_like(iteration, dtype=torch.bool)
    for _, expected, outlook, guarded in groups:
        if guarded:
            rate = expected / iteration
            short_of_switch = (rate < (1.0 + margin) / plain_ms) & ~may_slow
            short_of_guard = rate < (1.0 + guard_margin) / plain_ms
            if outlook is not None:
                keeps = outlook.keeps_what_plain_keeps(expected, wall, plain_wall, headroom)
                short_of_guard &= ~(keeps & may_slow)
            slows_guarded |= short_of_switch | short_of_guard
        if outlook is not None:
            kept += outlook.kept(expected, wall)
    objective = kept + THROUGHPUT_TIE * speedup
    objective[(verified == n) | ~reached.unsqueeze(1)] = -1.0  # nothing verified: no choice
    objective[slows_guarded] = -1.0
    best, count = divmod(int(objective.argmax()), size)
    d, w = shapes[best]
    nodes = count * n
    score = float(objective[best, count])
    tokens, ms = float(committed[best, count]), float(iteration[best, count])
    plain = float(plain_ms)
    if score < 0:
        # No choice: report the draft that comes nearest, not one that verifies nothing.
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
    """[L] bool: whether some shape commits more tokens per ms per request than a plain
    decode at plain_ms [L], for each load [L]. The plan guards each request's speed, so where
    this is false no plan speculates. True while a model is unfitted: the gain is to learn."""
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
    rate[..., 0] = 0.0  # nothing verified
    rate[:, ~gain.reached] = 0.0
    plain = torch.as_tensor(plain_ms, dtype=torch.float64)
    return (rate.amax(dim=(1, 2)) * plain > 1.0) | (plain <= 0)


@dataclass(frozen=True)
class SloOutlook:
    """Which of one SLO group's requests an iteration keeps on course. A request at q times
    its TPOT SLO t so far ends within it if it commits as many tokens again at (2 - q) t ms
    each: an iteration committing e tokens in wall time W keeps it if rho = e t / W >= theta
    = 1 / (2 - q). With the spread sigma of iterations' log wall time, it counts
    Phi(log(rho / theta) / sigma). per_slo: (tpot, sorted log theta, inf past recovery)."""

    spread: float
    per_slo: tuple[tuple[float, torch.Tensor], ...]

    @classmethod
    def of(
        cls, slo: SloBatch, members: torch.Tensor, spread: float,
        log_theta: torch.Tensor | None = None,
    ) -> SloOutlook:  # fmt: skip
        if log_theta is None:
            log_theta = recovery_log_theta(slo)
        per_slo = []
        for tpot in sorted(set(slo.tpot_slo_ms[members].tolist())):
            rows = members & (slo.tpot_slo_ms == tpot)
            per_slo.append((tpot, torch.sort(log_theta[rows]).values))
        return cls(spread, tuple(per_slo))

    def kept(self, expected: torch.Tensor, wall_ms: torch.Tensor) -> torch.Tensor:
        """expected, wall_ms [S, K] -> [S, K] expected count of requests kept on course."""
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
        """[S, K] bool: whether the pace keeps every request a plain decode keeps on course,
        with `headroom` to spare in log pace."""
        keeps = torch.ones_like(expected, dtype=torch.bool)
        for tpot, log_theta in self.per_slo:
            kept_by_plain = log_theta[log_theta <= _log_pace(1.0, tpot, plain_wall_ms)]
            if kept_by_plain.numel() == 0:
                continue
            keeps &= _log_pace(expected, tpot, wall_ms) >= float(kept_by_plain[-1]) + headroom
        return keeps

    def kept_by(self, plain_wall_ms: torch.Tensor) -> bool:
        """Whether a plain decode keeps one of the group's requests on course."""
        return any(
            bool(log_theta[0] <= _log_pace(1.0, tpot, plain_wall_ms))
            for tpot, log_theta in self.per_slo
        )


def _log_pace(expected, tpot: float, wall_ms):
    if isinstance(expected, torch.Tensor):
        return torch.log((expected * tpot / wall_ms).clamp(min=1e-12))
    return math.log(expected * tpot / float(wall_ms))


def recovery_log_theta(slo: SloBatch) -> torch.Tensor:
    """[B] log theta (`SloOutlook`), inf past recovery or without an SLO."""
    ratio = slo.tpot_ratio
    return torch.where(ratio < 2.0, -torch.log((2.0 - ratio).clamp(min=1e-9)), math.inf)


@dataclass(frozen=True)
class SpendCurve:
    """An iteration's ms with m = 0..L candidate nodes verified, the draft's sunk ms and the
    verify's (`TokensCurve`) summed when the draft is planned; `at` adds the context's term
    between the draft and its verify. base [L + 1] float64; floor: the sunk ms, the least the
    iteration costs (a verify's predicted ms is never below 0), kept above 0."""

    base: torch.Tensor
    per_context: float | None
    floor: float

    @classmethod
    def of(cls, sunk_ms: float, verify: TokensCurve) -> SpendCurve:
        base = (sunk_ms + verify.intercept) + verify.tokens_terms
        floor = max(sunk_ms, 1e-9)
        if verify.per_context is None:  # no term comes later: the floor now
            base = base.clamp(min=floor)
        return cls(base, verify.per_context, floor)

    def at(self, context_tokens: float) -> torch.Tensor:
        """[L + 1] float64 ms, > 0, with `context_tokens` in the KV cache."""
        if self.per_context is None:
            return self.base
        context_ms = self.per_context * float(context_tokens)
        return torch.add(self.base, context_ms).clamp_(min=self.floor)


def cost_budget(
    calibrated: torch.Tensor, valid: torch.Tensor, spend_ms: torch.Tensor
) -> torch.Tensor:
    """The candidate nodes to verify beside the B roots that maximize expected committed
    tokens per ms; a 0-d int64 tensor on the draft's device, so nothing is read on the host
    before the verify. spend_ms [L + 1] float64, > 0 and non-decreasing: the iteration's ms
    (the draft's sunk ms and the verify) with m candidate nodes verified, m = 0..L
    (`SpendCurve.at`); the caller's L bounds the valid nodes. Padding ranks last and adds
    nothing, so past the last real node the rate cannot rise and argmax, the first best, never
    buys padding."""
    n = calibrated.shape[0]
    f = to_dtype(torch.where(valid, calibrated, 0.0).flatten(), torch.float64)  # padding to 0
    ranked = torch.sort(f, descending=True).values  # best first
    if ranked.shape[0] >= spend_ms.shape[0]:  # nodes past the curve's L: not bought
        ranked = ranked[: spend_ms.shape[0] - 1]
    # [m + 1]: the n roots, then the best f' one by one
    expected = torch.nn.functional.pad(ranked, (1, 0), value=float(n)).cumsum(0)
    spend_ms = to_device(spend_ms, f.device)
    if spend_ms.shape[0] > expected.shape[0]:
        spend_ms = spend_ms[: expected.shape[0]]
    return torch.argmax(expected / spend_ms)
