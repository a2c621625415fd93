"""The adaspec policy (AdaSpec, seed 000): how deep to speculate and how many of each request's
draft tokens to verify, from a fitted latency model and the draft's own confidences.

Pure (tensors and dataclasses, no SGLang). Dims and terms as in `speculative/candidates.py`, plus
D: depth positions of a request's draft chain (column j holds the token at depth j + 1).

The paper's model, as used here:
- sequence: AdaSpec drafts sequences, so each request's sequence is the most probable chain of
  its candidate tree (a width-1 beam, `chain_positions`); c [B, D] its per-depth conditional
  confidences and AR [B, D] = cumprod(c) = f of the chain node (eq. 7; AR_0 = 1 is the bonus
  token, implicit);
- NAT = sum_i (1 + sum of request i's kept AR) (eq. 6);
- T_sd(k, n) = k * draft_step_ms + T_verify(B + n verified tokens, sum of context) (eq. 1-4): k
  draft steps, n kept draft tokens over the batch, the verify pass from the online LinearLatency
  fit (eq. 2's form) that `PolicyBase` keeps;
- goodput (Alg. 3): NAT / T_sd, or negative (invalid) when some request with an SLO would get an
  estimated TPOT T_sd / (1 + its kept AR sum) above its TPOT SLO.

The three algorithms:
- adaptive drafter (Alg. 1, `drafter_depth`): walk k = 0, 1, ...; predict step k + 1's
  confidences from history (a running mean per step index, batch-wide), go one step deeper only
  if the predicted goodput beats the current one; once a step is taken, its real confidences
  replace the prediction. In this system SGLang's EAGLE draft always runs its configured
  `--speculative-num-steps`: the drafter cannot save draft time, its answer k is the depth the
  policy *uses* (chains are cut at k before the verifier), and "executing" a step means reading
  the confidences the already-built tree holds for it. The walk still never looks at a step's
  real confidences before deciding to take it, as in the paper. T_sd still charges k draft
  steps, as the paper's model does, so k is the depth AdaSpec would have drafted (the time SGLang
  spends on steps past k is sunk). The history learns from every step SGLang drafted, folded in
  when the iteration's outcome is observed.
- confidence-prior verifier (Alg. 2, `confidence_prior_prune`): drop the kept token with the
  lowest AR (always some request's tail, since AR never grows along a chain) while goodput
  improves; each request verifies the rest of its chain.
- SLO-aware estimator (Alg. 3, `estimate_throughput`), with each request's own TPOT SLO.

Deviations from the paper, each for a reason stated where it is applied: the drafter starts
from the k = 0 estimate instead of goodput -1, and falls back to the best depth it reached when a
step's real confidences disappoint; invalid configurations keep an order by throughput; requests
no configuration can serve within their SLO are served best effort.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from sgl_adaspec.flags import ConfigError, check_flags, flag
from sgl_adaspec.scheduler.slo import SloBatch
from sgl_adaspec.speculative.policies.base import (
    Decision,
    IterationInput,
    PolicyBase,
    check_common_config,
)
from sgl_adaspec.speculative.shapes import chain_positions, chain_prefix_mask, selection_from_mask

# A step predicted with no history is assumed to be accepted (optimistic): the drafter then tries
# it, and its real confidences correct the estimate at once.
_UNSEEN_CONFIDENCE = 1.0
# Floor on an estimated iteration time (ms), so NAT / T stays finite if a fit predicts 0.
_MIN_ITERATION_MS = 1e-9


@dataclass(frozen=True)
class AdaspecPolicyConfig:
    """- slo_aware: apply Alg. 3's SLO check with each request's TPOT SLO (False: maximize
      estimated throughput only, and mark no request infeasible);
    - confidence_smoothing: weight of the newest iteration in the per-step running mean of draft
      confidence that predicts the next step (1: last iteration only);
    - min_depth: the drafter uses at least this many steps (the verifier may still drop tokens);
    - latency_smoothing: weight of the newest measurement in the latency moving averages;
    - baseline_tpot_ms: TPOT without speculation (None: estimated online)."""

    slo_aware: bool = True
    confidence_smoothing: float = 0.1
    min_depth: int = flag(
        0,
        "adaspec: the drafter never chooses fewer draft steps than this (default: "
        "%(default)s, i.e. it may switch speculation off when its estimate says it does not pay).",
        metavar="D",
        minimum=0,
    )
    latency_smoothing: float = 0.3
    baseline_tpot_ms: float | None = None

    def __post_init__(self) -> None:
        check_flags(self, "adaspec")
        if not 0 < self.confidence_smoothing <= 1:
            raise ValueError(
                f"confidence_smoothing must be in (0, 1], got {self.confidence_smoothing}"
            )
        check_common_config(self.latency_smoothing, self.baseline_tpot_ms)

    def check_steps(self, steps: int) -> None:
        """The depth floor must fit a draft of `steps` steps."""
        if self.min_depth > steps:
            raise ConfigError(
                f"--adaspec-min-depth {self.min_depth} exceeds --speculative-num-steps ({steps})"
            )


@dataclass(frozen=True)
class IterationCost:
    """T_sd(k, n) = k * draft_step_ms + verify_ms[n] for k draft steps and n kept draft tokens.
    - draft_step_ms: one draft step over the batch, ms;
    - verify_ms [M + 1] float: the verify pass with n = 0..M draft tokens kept (the B roots on
      top), ms. A table rather than a line so it is exactly what the latency fit predicts."""

    draft_step_ms: float
    verify_ms: torch.Tensor

    def iteration_ms(self, steps: int | torch.Tensor, draft_tokens: torch.Tensor) -> torch.Tensor:
        """steps: int or int64 broadcastable with draft_tokens [...] int64 -> [...] ms."""
        return steps * self.draft_step_ms + self.verify_ms[draft_tokens]


def estimate_throughput(
    accepted: torch.Tensor,
    draft_tokens: torch.Tensor,
    steps: int | torch.Tensor,
    cost: IterationCost,
    tpot_slo_ms: torch.Tensor,
) -> torch.Tensor:
    """Alg. 3's goodput of configurations [...]: NAT / T_sd when valid, else negative.

    - accepted [..., B]: expected tokens per request, 1 + its kept AR (so NAT = sum over B);
    - draft_tokens [...] int64: kept draft tokens over the batch; steps: draft steps (int or [...]);
    - tpot_slo_ms [B]: the TPOT each request must meet; NaN/inf = unconstrained.

    A configuration is invalid if a constrained request's estimated TPOT T_sd / accepted exceeds
    its SLO. The paper scores it -1; here -1 / (1 + NAT / T_sd), which is still below every valid
    score (>= 0) but keeps invalid configurations ordered by throughput, so a batch where nothing
    is valid is served for throughput instead of losing speculation altogether.
    """
    time_ms = cost.iteration_ms(steps, draft_tokens).clamp(min=_MIN_ITERATION_MS)  # [...]
    throughput = accepted.sum(dim=-1) / time_ms  # [...]
    tpot_ms = time_ms.unsqueeze(-1) / accepted  # [..., B]
    violated = torch.isfinite(tpot_slo_ms) & (tpot_ms > tpot_slo_ms)  # [..., B]
    return torch.where(violated.any(dim=-1), -1.0 / (1.0 + throughput), throughput)


def drafter_depth(
    ar: torch.Tensor,
    lengths: torch.Tensor,
    predicted: torch.Tensor,
    cost: IterationCost,
    tpot_slo_ms: torch.Tensor,
    min_depth: int = 0,
) -> int:
    """Alg. 1 (predict-execute-correct): the number of draft steps k to use, in [min(min_depth,
    D), D].

    - ar [B, D]: AR of each request's chain tokens; lengths [B] int64: chain lengths (<= D);
    - predicted [D]: confidence predicted for step j + 1 from history (not from this tree).

    At depth k the current goodput uses the real AR of steps 1..k; the guess for k + 1 extends
    each chain that has a step k + 1 by AR_k * predicted[k] (eq. 7 with a predicted c). The walk
    goes on while the guess beats the current goodput and stops at the first local maximum, which
    Theorem 4.3 (throughput quasi-concave in k) makes the global one; it returns the depth with
    the best real goodput among those it reached (the last one unless a guess was too optimistic).
    Unlike Alg. 1, which starts
    from goodput -1 and so always drafts a step when it is valid, the walk starts from the k = 0
    estimate: if even one step is predicted not to pay, speculation is off this iteration.
    All D + 1 current and D guessed estimates are computed at once; the walk is a scan over them.
    """
    bsz, max_d = ar.shape
    depth_index = torch.arange(max_d + 1, device=ar.device)  # [D + 1]: k = 0..D
    in_chain = depth_index[:-1] < lengths.unsqueeze(1)  # [B, D]
    ar = torch.where(in_chain, ar, 0.0)
    kept_ar = torch.cat([ar.new_zeros(bsz, 1), ar.cumsum(dim=1)], dim=1)  # [B, D + 1]: cut at k
    tokens = torch.minimum(lengths.unsqueeze(1), depth_index).sum(dim=0)  # [D + 1]
    current = estimate_throughput(1.0 + kept_ar.T, tokens, depth_index, cost, tpot_slo_ms)
    # Guess for k + 1 = current AR up to k, plus AR_k (AR_0 = 1) times the predicted confidence.
    ar_at_k = torch.cat([ar.new_ones(bsz, 1), ar[:, :-1]], dim=1)  # [B, D]
    guess_ar = torch.where(in_chain, ar_at_k * predicted.unsqueeze(0), 0.0)  # [B, D]
    guess = estimate_throughput(
        (1.0 + kept_ar[:, :-1] + guess_ar).T,
        tokens[:-1] + in_chain.sum(dim=0),
        depth_index[1:],
        cost,
        tpot_slo_ms,
    )  # [D]: goodput at k + 1 for k = 0..D-1
    start = min(min_depth, max_d)
    stops = (guess[start:] <= current[start:-1]).nonzero()  # steps that are not worth taking
    last = start + int(stops[0]) if len(stops) else max_d
    # A step taken on an optimistic guess may turn out worse (or break an SLO) once its real
    # confidences are in. The paper cannot un-draft it; here every step is in the tree anyway,
    # so the depth used is the best one the walk reached (the first such, on ties).
    return start + int(torch.argmax(current[start : last + 1]))


def confidence_prior_prune(
    ar: torch.Tensor,
    lengths: torch.Tensor,
    steps: int,
    cost: IterationCost,
    tpot_slo_ms: torch.Tensor,
) -> torch.Tensor:
    """Alg. 2: drop the lowest-AR kept token while goodput improves. Returns [B] int64 lengths.

    - ar [B, D]: AR of the chain tokens; lengths [B] int64: tokens each request keeps now;
    - steps: the drafter's k (its draft time stays in T_sd whatever is dropped).

    Since AR never grows along a chain, ordering the kept tokens by (AR asc, depth desc, request
    asc) drops every request's tokens tail first, so the whole greedy sequence is known up front:
    goodput is evaluated for every number of drops m = 0..M at once ([M + 1, B] accepted tokens,
    M = kept tokens) and the answer is the first m after which one more drop does not improve.
    """
    bsz, max_d = ar.shape
    kept = torch.arange(max_d, device=ar.device) < lengths.unsqueeze(1)  # [B, D]
    # Flip depth so that row-major flattening lists each request's tokens deepest first; a
    # stable sort by AR keeps that order (and request order) among equal AR.
    kept_rev = kept.flip(1)  # [B, D]
    flat_ar = ar.flip(1)[kept_rev]  # [M]
    flat_req = torch.arange(bsz, device=ar.device).unsqueeze(1).expand(bsz, max_d)[kept_rev]
    num_kept = flat_ar.numel()
    if num_kept == 0:
        return lengths.clone()
    order = torch.sort(flat_ar, stable=True).indices  # [M] drop order
    drop_ar, drop_req = flat_ar[order], flat_req[order]  # [M]
    lost = ar.new_zeros(num_kept, bsz)  # [M, B]: AR each drop takes from its request
    lost[torch.arange(num_kept, device=ar.device), drop_req] = drop_ar
    lost = torch.cat([ar.new_zeros(1, bsz), lost.cumsum(dim=0)], dim=0)  # [M + 1, B]
    accepted = 1.0 + torch.where(kept, ar, 0.0).sum(dim=1) - lost  # [M + 1, B]
    tokens = num_kept - torch.arange(num_kept + 1, device=ar.device)  # [M + 1]
    goodput = estimate_throughput(accepted, tokens, steps, cost, tpot_slo_ms)  # [M + 1]
    no_gain = (goodput[1:] <= goodput[:-1]).nonzero()  # drops that would not improve
    num_drops = int(no_gain[0]) if len(no_gain) else num_kept
    return lengths - torch.bincount(drop_req[:num_drops], minlength=bsz)


def infeasible_requests(
    ar: torch.Tensor,
    lengths: torch.Tensor,
    cost: IterationCost,
    tpot_slo_ms: torch.Tensor,
    min_depth: int = 0,
) -> torch.Tensor:
    """[B] bool: constrained requests no configuration of this iteration serves within their SLO.

    A request's most favorable configuration keeps j = 0..lengths of its own chain tokens and
    only the roots of the others, drafted with max(j, min_depth) steps; if even its best estimated
    TPOT there, min_j T_sd / (1 + sum of its first j AR), exceeds its SLO, no choice can help it.
    Such requests are served best effort (their SLO dropped from the check), so one hopeless
    request does not make every configuration invalid.
    """
    bsz, max_d = ar.shape
    own = torch.arange(max_d + 1, device=ar.device)  # [D + 1]: j
    tokens = torch.minimum(own.unsqueeze(0), lengths.unsqueeze(1))  # [B, D + 1]
    in_chain = own[:-1] < lengths.unsqueeze(1)  # [B, D]
    kept_ar = torch.cat(
        [ar.new_zeros(bsz, 1), torch.where(in_chain, ar, 0.0).cumsum(dim=1)], dim=1
    )  # [B, D + 1]
    time_ms = cost.iteration_ms(own.clamp(min=min(min_depth, max_d)), tokens)  # [B, D + 1]
    best_tpot_ms = (time_ms.clamp(min=_MIN_ITERATION_MS) / (1.0 + kept_ar)).amin(dim=1)  # [B]
    return torch.isfinite(tpot_slo_ms) & (best_tpot_ms > tpot_slo_ms)


@dataclass
class AdaspecPolicy(PolicyBase):
    """State across iterations: the latency fits of `PolicyBase` and the running mean of the
    draft's confidence per step index (batch-wide, so no per-request state to forget)."""

    config: AdaspecPolicyConfig = field(default_factory=AdaspecPolicyConfig)
    # [H] float64: running mean of the confidence at step j + 1; NaN = never observed.
    _confidence: torch.Tensor = field(
        default_factory=lambda: torch.empty(0, dtype=torch.float64), repr=False
    )
    # The last decision's per-step mean confidence [D] and which steps had tokens [D] bool,
    # folded into the running mean once its outcome is observed.
    _pending: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)
    # The drafter's last depth: the next draft runs one step deeper (Alg. 1's predict step).
    _last_depth: int | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.latency_smoothing = self.config.latency_smoothing
        self.baseline_tpot_ms_config = self.config.baseline_tpot_ms
        super().__post_init__()

    def predicted_confidence(self, num_steps: int) -> torch.Tensor:
        """[num_steps] float64: the confidence history predicts for steps 1..num_steps."""
        known = self._confidence[:num_steps]
        pad = torch.full((num_steps - known.numel(),), math.nan, dtype=torch.float64)
        predicted = torch.cat([known, pad])
        return torch.where(torch.isnan(predicted), _UNSEEN_CONFIDENCE, predicted)

    def iteration_cost(self, it: IterationInput, max_draft_tokens: int) -> IterationCost | None:
        """T_sd's terms for this batch, or None before any verify pass was observed. The verify
        table is `predict_verify_ms(B + n, sum of context)` for n = 0..max_draft_tokens, computed
        from the fit's coefficients in one go; a draft step costs 0 until one was measured."""
        verified = it.cands.num_requests + torch.arange(max_draft_tokens + 1, dtype=torch.float64)
        verify_ms = self.verify_latency.predict_tensor(verified, float(it.context_tokens))
        if verify_ms is None:
            return None
        return IterationCost(self.draft_step_ms or 0.0, verify_ms)

    def draft_widths(self, topk: int) -> list[int]:
        return [1]

    def draft_shape(
        self, num_requests: int, steps: int, topk: int, slo: SloBatch | None = None
    ) -> tuple[int, int]:
        """A chain (width-1 beam: the draft's argmax at every step, 1 / topk of the draft rows)
        one step deeper than the depth the drafter chose last (predict), so the decision on
        the drafted chain (execute, correct) can keep, cut or grow it by one."""
        if self._last_depth is None:
            return steps, 1
        return min(max(self._last_depth + 1, self.config.min_depth, 1), steps), 1

    def decide(self, it: IterationInput) -> Decision:
        cands = it.cands
        bsz = cands.num_requests
        nodes, conf = chain_positions(cands)  # [B, D'] node index, conditional confidence
        max_d = min(it.draft_depth, nodes.shape[1])
        nodes, conf = nodes[:, :max_d], conf[:, :max_d]
        # The decision math is tiny ([B, D]) and ends in host scalars: do it on CPU in float64,
        # which also makes it deterministic across devices.
        in_chain = (nodes >= 0).cpu()  # [B, D]
        lengths = in_chain.sum(dim=1)  # [B]
        f = torch.gather(cands.path_prob, 1, nodes.clamp(min=0)).cpu().double()  # [B, D]
        ar = torch.where(in_chain, f, 0.0)  # AR = f of the chain node (eq. 7)
        conf = conf.cpu().double()
        self._remember(conf, in_chain)
        infeasible = torch.zeros(bsz, dtype=torch.bool)
        cost = self.iteration_cost(it, int(lengths.sum()))
        if cost is None:
            # Nothing measured yet: no basis to trade tokens for time, verify every chain token
            # up to the draft's depth (this is also what the first measurements are made of).
            depth = max_d
        else:
            slo = it.slo.tpot_slo_ms.cpu().double()  # [B]
            if not self.config.slo_aware:
                slo = torch.full_like(slo, math.inf)
            min_depth = self.config.min_depth
            infeasible = infeasible_requests(ar, lengths, cost, slo, min_depth)
            slo = torch.where(infeasible, math.inf, slo)  # best effort for the hopeless
            predicted = self.predicted_confidence(max_d)
            depth = drafter_depth(ar, lengths, predicted, cost, slo, min_depth)
            lengths = confidence_prior_prune(ar, lengths.clamp(max=depth), depth, cost, slo)
        self._last_depth = depth
        mask = chain_prefix_mask(cands, nodes, lengths.to(nodes.device))  # [B, N]
        infeasible = infeasible.to(cands.valid.device)
        return Decision(selection_from_mask(mask), depth, 1, bsz + int(lengths.sum()), infeasible)

    def _remember(self, conf: torch.Tensor, in_chain: torch.Tensor) -> None:
        """Keep this iteration's per-step mean confidence over the requests that drafted the
        step (conf [B, D], in_chain [B, D]); SGLang drafted every step, so all of them count."""
        count = in_chain.sum(dim=0)  # [D]
        total = torch.where(in_chain, conf, 0.0).sum(dim=0)  # [D]
        self._pending = (total / count.clamp(min=1), count > 0)

    def observe_outcome(
        self, rids: tuple[str, ...], verified: torch.Tensor, accepted: torch.Tensor
    ) -> None:
        super().observe_outcome(rids, verified, accepted)
        if self._pending is None:
            return
        mean, seen = self._pending  # [D], [D]
        self._pending = None
        history = self._confidence
        if history.numel() < mean.numel():
            pad = torch.full((mean.numel() - history.numel(),), math.nan, dtype=torch.float64)
            history = torch.cat([history, pad])
        old = history[: mean.numel()]
        weight = self.config.confidence_smoothing
        # First observation of a step sets its mean; later ones move it by `weight`.
        new = torch.where(torch.isnan(old), mean, (1 - weight) * old + weight * mean)
        history[: mean.numel()] = torch.where(seen, new, old)
        self._confidence = history
