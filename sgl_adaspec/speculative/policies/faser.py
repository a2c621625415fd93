"""The faser policy (FASER, seed 001, section 4.1): a speculative length per request, found online.

Each request r verifies the first s_r nodes of its most probable draft chain (width 1), with
s_r picked from a small candidate set S by minimising the cost per committed token (eq. 1)

    J_r(s; b) = T(s; b) / (c_r(s) + eps)

- T(s; b): latency of one iteration of a batch of b requests that each verify s draft tokens:
  the draft's share (draft_depth x the per-step latency seen in `observe_iteration`; the draft
  always runs SGLang's configured steps, whatever s) plus the verify pass predicted by the
  fitted verify-latency model for b * (s + 1) tokens (roots included) and the batch's context.
  Until that model has data, the request's own observed iteration latencies at s stand in.
- c_r(s): committed tokens per iteration at length s, the paper's s * a_r(s): the *accepted
  draft tokens* (SGLang's accept length minus the bonus token). The paper's J counts only the
  tokens speculation earned; eps keeps a length that never got a draft accepted finite.

J_r is a noisy black box, so (eq. 3) the length is chosen by GP-LCB: a Gaussian process over s
(RBF kernel) fitted to the request's observed J, then argmin_s mu(s) - sqrt(beta) * sigma(s).
An unobserved length keeps the prior's large sigma, so it is tried before a known one is
re-used, without sweeping S. Statistics live in a per-request sliding window of `window`
iterations, so the choice follows changes in load and in the request's acceptance.

Token-wise early exit (section 4.2, `early_exit`): with `early_exit` "auto" each decision
carries an `EarlyExitPlan` with the batch's expected rejected draft tokens (eq. 5-6, from the
same windows at the chosen lengths); the adapter tests at `exit_layer` when eq. 10 says it pays
("always": every iteration). Not here: draft/verify overlap (needs GPU SM partitions);
`FaserConfig` refuses it.

Pure (tensors and dataclasses, no SGLang), like `adaserve.py`. Dims: B requests, N candidate
nodes, S candidate lengths, W window slots, Q query points; terms as in
`speculative/candidates.py`.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from sgl_adaspec.flags import ConfigError, check_flags, flag
from sgl_adaspec.scheduler.slo import SloBatch
from sgl_adaspec.speculative.early_exit import EarlyExitPlan, expected_rejected
from sgl_adaspec.speculative.policies.base import (
    Decision,
    IterationInput,
    PolicyBase,
    check_common_config,
    no_infeasible,
)
from sgl_adaspec.speculative.shapes import chain_positions, chain_prefix_mask, selection_from_mask

EXIT_PROBE_INTERVAL = 64
# Token-wise early exit: never, when eq. 10 says it pays, on every verify.
EARLY_EXIT_MODES = ("off", "auto", "always")


def parse_lengths(value) -> tuple[int, ...]:
    """--faser-lengths "1,2,4" (ascending, repeats dropped), or a sequence of ints as is."""
    if isinstance(value, str):
        return tuple(sorted({int(part) for part in value.split(",")}))
    return tuple(value)


def check_lengths(lengths: tuple[int, ...], label: str) -> None:
    if not isinstance(lengths, tuple) or not lengths:
        raise ValueError(f"{label} must be a non-empty tuple of ints, got {lengths!r}")
    if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in lengths):
        raise ValueError(f"{label} must be ints >= 1, got {lengths}")
    if len(set(lengths)) != len(lengths):
        raise ValueError(f"{label} repeat a value: {lengths}")


def refuse_overlap(overlap: bool, label: str) -> None:
    if overlap:
        raise ValueError(
            f"{label} is not available: overlapping draft and verify needs GPU SM partitions "
            f"(CUDA green contexts), which this build does not implement"
        )


@dataclass(frozen=True)
class FaserConfig:
    """- lengths: candidate speculative lengths S, draft tokens verified per request
      (`--faser-lengths`); None: 1..draft_depth. Lengths deeper than the draft are clipped to it;
    - window: iterations of statistics kept per request (`--faser-window`);
    - beta: GP-LCB exploration weight (eq. 3's beta_n, held constant);
    - lengthscale: RBF kernel length scale, in tokens of s (how alike neighbouring lengths are);
    - noise: observation noise std of one iteration's J, relative to the request's best J
      (the GP works in those units; the prior std is 1, i.e. "up to 100% worse");
    - eps: added to the committed tokens in J's denominator (eq. 1);
    - latency_smoothing / baseline_tpot_ms: as in `PolicyBase`;
    - early_exit: token-wise early exit in verification (`--faser-early-exit`): "off", "auto"
      (when eq. 10 says it pays) or "always"; exit_layer: layers run before the test
      (`--faser-exit-layer`; None: half the model); exit_topk: K of the top-K test
      (`--faser-exit-topk`, the paper's 10);
    - overlap: draft/verify overlap on GPU SM partitions (`--faser-overlap`); not available,
      True raises."""

    lengths: tuple[int, ...] | None = flag(
        None,
        "faser: candidate speculative lengths (default: 1..--speculative-num-steps).",
        metavar="L1,L2,...",
        must="comma-separated integers like 1,2,4",
        parse=parse_lengths,
        check=check_lengths,
    )
    window: int = flag(
        16,
        "faser: observations per request in the sliding window (default: %(default)s).",
        metavar="N",
        minimum=1,
    )
    beta: float = 2.0
    lengthscale: float = 1.0
    noise: float = 0.3
    eps: float = 0.1
    latency_smoothing: float = 0.3
    baseline_tpot_ms: float | None = None
    early_exit: str = flag(
        "off",
        "faser: token-wise early exit inside verification: after --faser-exit-layer layers, "
        "draft tokens outside the intermediate top-K leave the pass with their suffix. auto "
        "(the bare flag): when the expected saving exceeds the test's cost; always: every "
        "verify. LlamaForCausalLM targets with the CPU recipe's torch attention backend; "
        "elsewhere the full pass runs (default: %(default)s).",
        choices=EARLY_EXIT_MODES,
        nargs="?",
        const="auto",
    )
    exit_layer: int | None = flag(
        None,
        "faser: target layers run before the early-exit test (default: half the model; "
        "clipped to 1..layers-1).",
        metavar="L",
        minimum=1,
        must="an integer >= 1",
    )
    exit_topk: int = flag(
        10,
        "faser: a draft token exits when K tokens outscore it at the exit layer "
        "(default: %(default)s).",
        metavar="K",
        minimum=1,
        must="an integer >= 1",
    )
    overlap: bool = flag(
        False,
        "faser: draft/verify overlap on GPU SM partitions. NOT AVAILABLE (GPU-only, not "
        "implemented); the flag is refused.",
        check=refuse_overlap,
        action="store_true",
    )

    def __post_init__(self) -> None:
        check_flags(self, "faser")
        for name in ("lengthscale", "noise", "eps"):
            if not getattr(self, name) > 0:
                raise ValueError(f"faser {name} must be > 0, got {getattr(self, name)}")
        if not self.beta >= 0:
            raise ValueError(f"faser beta must be >= 0, got {self.beta}")
        check_common_config(self.latency_smoothing, self.baseline_tpot_ms)

    def check_steps(self, steps: int) -> None:
        """Every candidate length must fit a draft of `steps` steps."""
        if self.lengths and max(self.lengths) > steps:
            raise ConfigError(
                f"--faser-lengths {','.join(map(str, self.lengths))} exceeds "
                f"--speculative-num-steps ({steps})"
            )


class Observation(NamedTuple):
    """One iteration of one request: the length it asked for, the draft tokens it committed
    (bonus excluded), the iteration's wall time and the batch size b it ran in. Once the
    verify-latency model has data, T(s; b) is re-predicted for the current b rather than read
    from latency_ms (an iteration's latency depends on the whole batch's lengths, not on this
    request's alone); latency_ms and batch_size then only document the context."""

    length: int
    committed: float
    latency_ms: float
    batch_size: int


# ---- pure math: window statistics, cost, GP posterior, LCB ----


def window_statistics(
    obs_length: torch.Tensor,
    committed: torch.Tensor,
    latency_ms: torch.Tensor,
    lengths: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-length means over each request's window. obs_length [B, W] int64 (-1: empty slot or
    a length no longer in S), committed / latency_ms [B, W] float, lengths [S] int64.
    Returns count [B, S], mean committed [B, S], mean latency [B, S] (0 where count is 0)."""
    hit = (obs_length.unsqueeze(-1) == lengths).to(committed.dtype)  # [B, W, S]
    count = hit.sum(dim=1)  # [B, S]
    denom = count.clamp(min=1.0)
    committed_mean = torch.einsum("bws,bw->bs", hit, committed) / denom
    latency_mean = torch.einsum("bws,bw->bs", hit, latency_ms) / denom
    return count, committed_mean, latency_mean


def cost_per_committed_token(
    latency_ms: torch.Tensor, committed: torch.Tensor, eps: float
) -> torch.Tensor:
    """FASER eq. 1: J = T / (committed + eps), elementwise (broadcasting)."""
    return latency_ms / (committed + eps)


def rbf_kernel(x1: torch.Tensor, x2: torch.Tensor, lengthscale: float) -> torch.Tensor:
    """k(x, x') = exp(-(x - x')^2 / (2 l^2)) for x1 [..., P], x2 [..., Q] -> [..., P, Q]
    (unit signal variance: the GP works in units of the request's best J)."""
    diff = x1.unsqueeze(-1) - x2.unsqueeze(-2)
    return torch.exp(-0.5 * (diff / lengthscale) ** 2)


def gp_posterior(
    x_obs: torch.Tensor,
    y_obs: torch.Tensor,
    noise_var: torch.Tensor,
    obs_mask: torch.Tensor,
    x_query: torch.Tensor,
    lengthscale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Posterior of R independent zero-mean GPs (RBF kernel, unit prior variance), batched.

    x_obs / y_obs / noise_var [R, M] float, obs_mask [R, M] bool (False: slot ignored),
    x_query [Q] or [R, Q] float. Returns mean [R, Q] and variance [R, Q]:
    mu = k*^T (K + D)^-1 y, var = 1 - k*^T (K + D)^-1 k*, D = diag(noise_var).
    Masked slots are cut out of the linear system by turning their rows and columns into the
    identity (with y = 0 and k* = 0 there), so every request solves one [M, M] system
    whatever its number of observations."""
    mask = obs_mask.to(x_obs.dtype)  # [R, M]
    pair = mask.unsqueeze(-1) * mask.unsqueeze(-2)  # [R, M, M]
    gram = rbf_kernel(x_obs, x_obs, lengthscale) * pair
    gram = gram + torch.diag_embed(torch.where(obs_mask, noise_var, 1.0))  # [R, M, M]
    if x_query.ndim == 1:
        x_query = x_query.expand(x_obs.shape[0], -1)  # [R, Q]
    cross = rbf_kernel(x_obs, x_query, lengthscale) * mask.unsqueeze(-1)  # [R, M, Q]
    solved = torch.linalg.solve(gram, torch.cat([(y_obs * mask).unsqueeze(-1), cross], dim=-1))
    alpha, v = solved[..., :1], solved[..., 1:]  # [R, M, 1], [R, M, Q]
    mean = (cross * alpha).sum(dim=-2)  # [R, Q]
    var = (1.0 - (cross * v).sum(dim=-2)).clamp(min=0.0)  # [R, Q]
    return mean, var


def lcb_argmin(mean: torch.Tensor, var: torch.Tensor, beta: float) -> torch.Tensor:
    """FASER eq. 3: argmin over the last dim of mu - sqrt(beta) * sigma; mean / var [R, Q]
    -> [R] int64 (ties: the first, i.e. shortest, length)."""
    return torch.argmin(mean - math.sqrt(beta) * var.sqrt(), dim=-1)


# ---- the policy ----


@dataclass
class FaserPolicy(PolicyBase):
    config: FaserConfig = field(default_factory=FaserConfig)
    # Per request: its last `window` observations; the length it was given this iteration;
    # outcomes waiting for the iteration's latency (observe_iteration comes last).
    _windows: dict[str, deque[Observation]] = field(default_factory=dict, repr=False)
    _chosen: dict[str, int] = field(default_factory=dict, repr=False)
    _pending: list[tuple[str, int, float, int]] = field(default_factory=list, repr=False)
    # Smoothed measured latency of the early-exit test per tested row (eq. 10's T_ee + T_pr),
    # and plans made since it was last measured: every EXIT_PROBE_INTERVAL-th plan tests again
    # so one slow (e.g. first-call) measurement cannot keep "auto" off for good.
    exit_test_ms_per_row: float | None = None
    _plans_since_test: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        self.latency_smoothing = self.config.latency_smoothing
        self.baseline_tpot_ms_config = self.config.baseline_tpot_ms
        super().__post_init__()

    def candidate_lengths(self, draft_depth: int) -> tuple[int, ...]:
        """S for a draft of `draft_depth` steps: the configured lengths clipped to the chain the
        draft can produce (a longer length would verify the same tokens as draft_depth, so it
        would only be one more arm for GP-LCB to explore)."""
        if self.config.lengths is None:
            return tuple(range(1, draft_depth + 1))
        return tuple(sorted({min(s, draft_depth) for s in self.config.lengths} - {0}))

    def window_tensors(
        self, rids: tuple[str, ...]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The windows of `rids` as obs_length [B, W] int64 (-1: empty), committed [B, W] and
        latency_ms [B, W] float64, W = config.window. One tensor build, no per-element writes."""
        width = self.config.window
        empty = (-1.0, 0.0, 0.0)
        rows = []
        for rid in rids:
            window = [(o.length, o.committed, o.latency_ms) for o in self._windows.get(rid, ())]
            rows.append(window + [empty] * (width - len(window)))
        data = torch.tensor(rows, dtype=torch.float64).reshape(len(rids), width, 3)
        return data[..., 0].long(), data[..., 1], data[..., 2]

    def predicted_latency_ms(
        self, lengths: torch.Tensor, batch_size: int, context_tokens: int, draft_depth: int
    ) -> torch.Tensor | None:
        """T(s; b) [S] float64 for a batch of `batch_size` requests each verifying s draft
        tokens; None until the verify-latency model has an observation."""
        draft_ms = draft_depth * (self.draft_step_ms or 0.0)
        verify = [
            self.predict_verify_ms(batch_size * (s + 1), context_tokens) for s in lengths.tolist()
        ]
        if any(t is None for t in verify):
            return None
        return draft_ms + torch.tensor(verify, dtype=torch.float64)

    def window_means(
        self, rids: tuple[str, ...], lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """count, mean committed and mean latency [B, S] per request and length (see
        `window_statistics`)."""
        return window_statistics(*self.window_tensors(rids), lengths)

    def costs(
        self, it: IterationInput, lengths: torch.Tensor, means=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """J [B, S] float64 of every request and length, and count [B, S]: its observations
        in the window (J is meaningless where count is 0). `means`: `window_means`, if known."""
        count, committed_mean, latency_mean = means or self.window_means(it.rids, lengths)
        batch_latency = self.predicted_latency_ms(
            lengths, it.cands.num_requests, it.context_tokens, it.draft_depth
        )
        # The model predicts T under the current batch (the paper's context b); before it has
        # data, the latencies the request saw at each length are the best estimate there is.
        latency = latency_mean if batch_latency is None else batch_latency.expand_as(count)
        # Ratio of window means, i.e. eq. 1 with the windowed estimates of T and s * a, rather
        # than a mean of per-iteration ratios: one iteration with nothing accepted would put
        # T / eps into the latter and swamp the GP.
        return cost_per_committed_token(latency, committed_mean, self.config.eps), count

    def early_exit_plan(
        self, lengths: torch.Tensor, chosen: torch.Tensor, means
    ) -> EarlyExitPlan | None:
        """The verify pass's early exit for requests verifying `chosen` [B] of `lengths` [S]."""
        cfg = self.config
        if cfg.early_exit == "off" or chosen.numel() == 0:
            return None
        count, committed_mean, _ = means
        slot = torch.searchsorted(lengths, chosen).clamp(max=lengths.numel() - 1).unsqueeze(1)
        rejected = expected_rejected(
            chosen.to(torch.float64),
            committed_mean.gather(1, slot).squeeze(1),
            count.gather(1, slot).squeeze(1) > 0,
        )
        self._plans_since_test += 1
        probe = self._plans_since_test > EXIT_PROBE_INTERVAL
        return EarlyExitPlan(
            cfg.exit_layer,
            cfg.exit_topk,
            rejected,
            forced=cfg.early_exit == "always",
            verify_ms_per_token=self.verify_ms_per_token(),
            test_ms_per_row=None if probe else self.exit_test_ms_per_row,
        )

    def observe_early_exit(self, tested: int, exited: int, test_ms: float) -> None:
        super().observe_early_exit(tested, exited, test_ms)
        if tested > 0:
            self.exit_test_ms_per_row = self._smooth(self.exit_test_ms_per_row, test_ms / tested)
            self._plans_since_test = 0

    def choose_lengths(
        self, cost: torch.Tensor, count: torch.Tensor, lengths: torch.Tensor
    ) -> torch.Tensor:
        """GP-LCB per request: cost / count [B, S] -> chosen length [B] int64."""
        cfg = self.config
        observed = count > 0  # [B, S]
        # Work in units of the request's best observed cost: y = J / J_best - 1 >= 0. The prior
        # mean 0 is then "as good as the best so far", so unexplored lengths are tried first,
        # and one kernel scale fits requests whose costs differ by orders of magnitude.
        best = torch.where(observed, cost, math.inf).amin(dim=1, keepdim=True)  # [B, 1]
        y = torch.where(observed, cost / best.clamp(min=1e-12) - 1.0, 0.0)
        # A length seen n times is the mean of n noisy iterations: noise variance / n.
        noise_var = cfg.noise**2 / count.clamp(min=1.0)
        x = lengths.to(torch.float64)
        mean, var = gp_posterior(x.expand_as(y), y, noise_var, observed, x, cfg.lengthscale)
        return lengths[lcb_argmin(mean, var, cfg.beta)]

    def draft_widths(self, topk: int) -> list[int]:
        return [1]

    def draft_shape(
        self, num_requests: int, steps: int, topk: int, slo: SloBatch | None = None
    ) -> tuple[int, int]:
        """A chain policy reads only each request's most probable chain, which a width-1 beam
        drafts (the draft's argmax at every step) at 1 / topk of the draft rows."""
        return max(self.candidate_lengths(steps)), 1

    def decide(self, it: IterationInput) -> Decision:
        bsz = it.cands.num_requests
        lengths = torch.tensor(self.candidate_lengths(it.draft_depth), dtype=torch.int64)  # [S]
        plan = None
        if bsz == 0 or lengths.numel() == 0:
            chosen = torch.zeros(bsz, dtype=torch.int64)
        else:
            means = self.window_means(it.rids, lengths)
            chosen = self.choose_lengths(*self.costs(it, lengths, means), lengths)  # [B]
            plan = self.early_exit_plan(lengths, chosen, means)
        self._chosen.update(zip(it.rids, chosen.tolist()))
        nodes, _ = chain_positions(it.cands)  # [B, D]
        mask = chain_prefix_mask(it.cands, nodes, chosen.to(nodes.device))  # [B, N]
        selection = selection_from_mask(mask)
        depth = int(chosen.max()) if bsz else 0
        return Decision(selection, depth, 1, selection.total_tokens, no_infeasible(it), plan)

    def observe_outcome(
        self, rids: tuple[str, ...], verified: torch.Tensor, accepted: torch.Tensor
    ) -> None:
        super().observe_outcome(rids, verified, accepted)
        # An outcome whose iteration latency never came is still worth its acceptance.
        self._flush(self.t_spec_ms)
        bsz = len(rids)
        for rid, num_verified, num_accepted in zip(rids, verified.tolist(), accepted.tolist()):
            # Keyed by the length asked for (the chain may have been shorter), so every length
            # in S is observable; committed = accepted draft tokens, the bonus excluded.
            length = self._chosen.pop(rid, int(num_verified) - 1)
            self._pending.append((rid, length, max(float(num_accepted) - 1.0, 0.0), bsz))

    def observe_iteration(self, latency_ms: float, *args, **kwargs) -> None:
        super().observe_iteration(latency_ms, *args, **kwargs)
        self._flush(latency_ms)

    def _flush(self, latency_ms: float | None) -> None:
        if latency_ms is not None:
            for rid, length, committed, bsz in self._pending:
                window = self._windows.setdefault(rid, deque(maxlen=self.config.window))
                window.append(Observation(length, committed, latency_ms, bsz))
        self._pending.clear()

    def forget(self, rid: str) -> None:
        self._windows.pop(rid, None)
        self._chosen.pop(rid, None)
        self._pending = [p for p in self._pending if p[0] != rid]

    def window(self, rid: str) -> tuple[Observation, ...]:
        """The request's observations, oldest first (empty for an unknown request)."""
        return tuple(self._windows.get(rid, ()))
