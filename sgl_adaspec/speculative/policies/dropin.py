"""The dropin policy (on-the-fly adaptive speculation, seed 004): a per-request window.

Each request r has a window k_r: how deep into its EAGLE tree it verifies (the paper's gamma,
applied to trees as the tree depth, its section on EAGLE-2; the width stays the draft's). The
window adapts after every verification from what the request accepted, by one of three rules
(`DropinVariant`):
- MLE (Method 1): estimate the per-token acceptance beta from the request's last `history`
  verifications (`mle_acceptance`, eq. 2, capped at acc_max) and pick the k maximizing expected
  committed tokens per ms, G(k) (`window_gain`, eq. 1);
- FSM (Method 2): a saturating counter, k - 1 after a rejection, k + 1 when all k were accepted;
- CACHE_FSM (Method 3): k moves with whether the accepted tokens were already in the request's
  token cache (prompt and output so far); see `cache_fsm_step`.

Terms: V = accepted draft tokens of one verification (SGLang's accept length minus the bonus
token); a verification with window k is a rejection when V < k. Windows live in
[min_window, max_window], max_window defaulting to (and never exceeding) the draft depth.

Pure (tensors and dataclasses, no SGLang). Dims and terms as in `speculative/candidates.py`,
K = number of windows considered.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from sgl_adaspec.flags import check_flags, flag
from sgl_adaspec.scheduler.slo import SloBatch
from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.policies.base import (
    Decision,
    IterationInput,
    PolicyBase,
    check_common_config,
    no_infeasible,
)
from sgl_adaspec.speculative.shapes import restrict_to_shape, selection_from_mask

# Latency floor (ms) in G(k)'s denominator: a fitted verify model may predict 0 ms.
_MIN_LATENCY_MS = 1e-6


class DropinVariant(enum.Enum):
    MLE = "mle"
    FSM = "fsm"
    CACHE_FSM = "cache-fsm"


@dataclass(frozen=True)
class DropinConfig:
    """- variant: the window rule (`--dropin-variant`);
    - history: verifications per request in the MLE estimate (`--dropin-history`, the paper's h);
    - acc_max: cap on the estimated acceptance (the paper's Acc_max, keeps G finite);
    - min_window / max_window: window range (draft tokens deep); max None = the draft depth;
    - latency_smoothing, baseline_tpot_ms: as in `PolicyBase`."""

    variant: DropinVariant = flag(  # noqa: RUF009 (a field with metadata, as field())
        DropinVariant.MLE,
        "dropin: window rule (default: %(default)s).",
        choices=tuple(v.value for v in DropinVariant),
        parse=DropinVariant,
    )
    history: int = flag(
        8,
        "dropin: verifications per request in the acceptance estimate (default: %(default)s).",
        metavar="N",
        minimum=1,
    )
    acc_max: float = 0.98
    min_window: int = 1
    max_window: int | None = None
    latency_smoothing: float = 0.3
    baseline_tpot_ms: float | None = None

    def __post_init__(self) -> None:
        check_flags(self, "dropin")
        if not 0 < self.acc_max < 1:
            raise ValueError(f"dropin acc_max must be in (0, 1), got {self.acc_max}")
        if not isinstance(self.min_window, int) or self.min_window < 0:
            raise ValueError(f"dropin min_window must be an int >= 0, got {self.min_window!r}")
        if self.max_window is not None and (
            not isinstance(self.max_window, int) or self.max_window < max(self.min_window, 1)
        ):
            raise ValueError(
                f"dropin max_window must be an int >= max(min_window, 1) = "
                f"{max(self.min_window, 1)}, got {self.max_window!r}"
            )
        check_common_config(self.latency_smoothing, self.baseline_tpot_ms)


# --- the paper's formulas, as pure functions ----------------------------------------------------


def mle_acceptance(accepted: Sequence[int], windows: Sequence[int], acc_max: float) -> float | None:
    """Per-token acceptance beta from verifications j with V_j = accepted[j] draft tokens
    accepted out of windows[j] (eq. 2): sum V / (sum V + #{j : V_j < k_j}), capped at acc_max.

    Each accepted token is a success and each rejection one failure of a geometric trial, so
    this is the MLE of the success rate (the paper's linear approximation of eq. 11). None when
    there is no evidence (no verification, or only windows of 0)."""
    successes = sum(accepted)
    failures = sum(1 for v, k in zip(accepted, windows, strict=True) if v < k)
    if successes + failures == 0:
        return None
    return min(successes / (successes + failures), acc_max)


def expected_committed(beta: torch.Tensor, windows: torch.Tensor) -> torch.Tensor:
    """[B, K]: expected tokens a verification with window k commits, bonus included, when each
    draft token is accepted with probability beta (truncated geometric, paper B.1):
    sum_{i=0..k} beta^i = (1 - beta^(k+1)) / (1 - beta). beta [B], windows [K]."""
    beta = beta.double().unsqueeze(1)  # [B, 1]
    k = windows.double().unsqueeze(0)  # [1, K]
    closed = (1 - beta ** (k + 1)) / (1 - beta)
    return torch.where(beta < 1, closed, k + 1)  # beta = 1: every draft token, k + 1


def window_gain(
    beta: torch.Tensor, windows: torch.Tensor, draft_ms: float, verify_ms: torch.Tensor
) -> torch.Tensor:
    """[B, K]: G(k) = (1 - beta^(k+1)) / ((1 - beta) * (k * a_q + b_p(k))) (eq. 1), expected
    committed tokens per ms of one draft-and-verify step. beta [B]; windows [K]; draft_ms = a_q,
    ms per draft step; verify_ms [B, K] = b_p(k) for request b at window k."""
    latency = windows.double().unsqueeze(0) * draft_ms + verify_ms.double()  # [B, K]
    return expected_committed(beta, windows) / latency.clamp(min=_MIN_LATENCY_MS)


def best_window(
    beta: torch.Tensor, windows: torch.Tensor, draft_ms: float, verify_ms: torch.Tensor
) -> torch.Tensor:
    """[B] int64: argmax_k G(k) over `windows` [K] (ascending); ties go to the smaller window
    (same expected rate for less work)."""
    gain = window_gain(beta, windows, draft_ms, verify_ms)
    return windows[gain.argmax(dim=1)]  # argmax returns the first maximum


def fsm_step(window: int, accepted: int, used: int) -> int:
    """FSM (Method 2): the next window after accepting `accepted` of `used` draft tokens with
    window `window` (unclipped): - 1 on a rejection, + 1 when all were accepted."""
    return window + 1 if accepted >= used else window - 1


def cache_fsm_step(window: int, accepted_tokens: Sequence[int], used: int, cache: set[int]) -> int:
    """Cache-FSM (Method 3): the next window (unclipped) after a verification that accepted
    `accepted_tokens` (the draft tokens, bonus excluded) of a window of `used`. `cache` holds
    the tokens seen before this verification (prompt, earlier output). As the paper states it:
    + 1 if an accepted token is already in the cache, - 1 if none is, and + 1 more when all
    `used` draft tokens were accepted (so a full acceptance of unseen tokens leaves k as is).
    The cache is read as it was before this verification (the paper updates it per step)."""
    hit = any(token in cache for token in accepted_tokens)
    # With a window of 0 nothing was drafted, so there is no token to judge: only the
    # "all accepted" step applies (otherwise k = 0 would be absorbing).
    step = 1 if hit else (-1 if used > 0 else 0)
    if len(accepted_tokens) >= used:
        step += 1
    return window + step


# --- per-request state and the policy ------------------------------------------------------------


@dataclass
class _RequestState:
    """- window: the current window (FSM state; MLE: the last choice);
    - outcomes: (V, k) of the last `history` verifications;
    - used: the depth verified this iteration, until its outcome arrives;
    - unresolved: cache-FSM's outcome (V, k), kept until the next `decide` shows its tokens;
    - cache / seen: cache-FSM's token cache and how much of the token history it has read."""

    window: int
    outcomes: deque[tuple[int, int]]
    used: int | None = None
    unresolved: tuple[int, int] | None = None
    cache: set[int] | None = None
    seen: int = 0


@dataclass
class DropinPolicy(PolicyBase):
    """With `DropinVariant.CACHE_FSM`, `decide` reads `it.history`: tuple[list[int], ...], one
    token list per request (prompt + output so far, in batch order); the adapter passes it when
    `needs_history` is true. Other variants never read it."""

    config: DropinConfig = field(default_factory=DropinConfig)
    _requests: dict[str, _RequestState] = field(default_factory=dict, repr=False)
    _window_range: tuple[int, int] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.latency_smoothing = self.config.latency_smoothing
        self.baseline_tpot_ms_config = self.config.baseline_tpot_ms
        super().__post_init__()

    @property
    def needs_history(self) -> bool:
        return self.config.variant is DropinVariant.CACHE_FSM

    def draft_shape(
        self, num_requests: int, steps: int, topk: int, slo: SloBatch | None = None
    ) -> tuple[int, int]:
        """The configured width, one step deeper than the deepest window of the running
        requests (so a window can grow by one per iteration); the full depth before any."""
        windows = [state.window for state in self._requests.values()]
        if not windows:
            return steps, topk
        return min(max(max(windows) + 1, self.config.min_window, 1), steps), topk

    def window_range(self, draft_depth: int) -> tuple[int, int]:
        """[lo, hi] windows: the configured range, hi never deeper than the draft."""
        hi = min(self.config.max_window or draft_depth, draft_depth)
        lo = self.config.min_window
        if lo > hi:
            raise ValueError(
                f"dropin min_window {lo} exceeds the draft depth --speculative-num-steps "
                f"{draft_depth}"
            )
        return lo, hi

    def window(self, rid: str) -> int | None:
        state = self._requests.get(rid)
        return None if state is None else state.window

    def decide(self, it: IterationInput) -> Decision:
        lo, hi = self.window_range(it.draft_depth)
        self._window_range = (lo, hi)
        states = [self._state(rid, hi) for rid in it.rids]
        if self.config.variant is DropinVariant.CACHE_FSM:
            self._read_history(states, getattr(it, "history", None), lo, hi)
        for state in states:  # the range may have changed with the draft depth
            state.window = min(max(state.window, lo), hi)
        if self.config.variant is DropinVariant.MLE:
            self._choose_mle_windows(it, states, lo, hi)
        windows = torch.tensor([s.window for s in states], dtype=torch.int64)  # [B]
        shaped = restrict_to_shape(it.cands, windows, it.draft_width)
        # Record the depth actually verified: a tree shallower than k makes a full acceptance
        # of it a success, not a rejection at the missing levels.
        for state, used in zip(states, shaped.max_depth.tolist(), strict=True):
            state.used = used
        selection = selection_from_mask(shaped.valid)
        depth = int(windows.max()) if windows.numel() else 0
        return Decision(selection, depth, it.draft_width, selection.total_tokens, no_infeasible(it))

    def observe_outcome(
        self, rids: tuple[str, ...], verified: torch.Tensor, accepted: torch.Tensor
    ) -> None:
        super().observe_outcome(rids, verified, accepted)
        if self._window_range is None:
            return
        lo, hi = self._window_range
        for rid, committed in zip(rids, accepted.tolist(), strict=True):
            state = self._requests.get(rid)
            if state is None or state.used is None:
                continue
            drafts = max(int(committed) - 1, 0)  # V: the bonus token is not a draft token
            used, state.used = state.used, None
            state.outcomes.append((drafts, used))
            if self.config.variant is DropinVariant.FSM:
                state.window = min(max(fsm_step(state.window, drafts, used), lo), hi)
            elif self.config.variant is DropinVariant.CACHE_FSM:
                state.unresolved = (drafts, used)  # the tokens arrive with the next history

    def forget(self, rid: str) -> None:
        super().forget(rid)
        self._requests.pop(rid, None)

    # --- helpers ---------------------------------------------------------------------------------

    def _state(self, rid: str, hi: int) -> _RequestState:
        # A new request starts at the deepest window, i.e. as the configured EAGLE tree would.
        state = self._requests.get(rid)
        if state is None:
            state = _RequestState(window=hi, outcomes=deque(maxlen=self.config.history))
            self._requests[rid] = state
        return state

    def _read_history(
        self,
        states: list[_RequestState],
        history: Sequence[Sequence[int]] | None,
        lo: int,
        hi: int,
    ) -> None:
        """Cache-FSM: apply last verification's outcome now that its tokens are in the history,
        then add them to the cache. The first V new tokens are the accepted draft tokens."""
        if history is None or len(history) != len(states):
            raise ValueError(
                "dropin cache-fsm needs IterationInput.history: one token list (prompt + output) "
                f"per request, got {None if history is None else len(history)} for {len(states)}"
            )
        for state, tokens in zip(states, history, strict=True):
            if state.cache is None:
                state.cache, state.seen = set(tokens), len(tokens)
                state.unresolved = None
                continue
            new = tokens[state.seen :]
            if state.unresolved is not None:
                drafts, used = state.unresolved
                step = cache_fsm_step(state.window, new[:drafts], used, state.cache)
                state.window = min(max(step, lo), hi)
                state.unresolved = None
            state.cache.update(new)
            state.seen = len(tokens)

    def _choose_mle_windows(
        self, it: IterationInput, states: list[_RequestState], lo: int, hi: int
    ) -> None:
        """Method 1 for every request with evidence; one without keeps its window (hi at the
        start). b_p(k) is the fitted verify latency of the whole batch with this request at k
        and every other request at its current window (one best-response pass, not a joint
        search); a_q is the smoothed draft-step latency. Before any latency is observed: a_q = 0
        and b_p constant, so G is the expected committed tokens and the deepest window wins."""
        acc_max = self.config.acc_max
        betas = [
            mle_acceptance([v for v, _ in s.outcomes], [k for _, k in s.outcomes], acc_max)
            for s in states
        ]
        rows = [i for i, beta in enumerate(betas) if beta is not None]
        if not rows:
            return
        windows = torch.arange(lo, hi + 1)  # [K]
        tokens = _tokens_upto(it.cands, hi, it.draft_width)  # [B, hi + 1]
        current = torch.tensor([s.window for s in states])  # [B]
        own = tokens.gather(1, current.unsqueeze(1)).squeeze(1)  # [B]
        others = own.sum() - own  # [B]: everyone else's tokens, roots included
        batch_tokens = others.unsqueeze(1) + tokens[:, lo : hi + 1]  # [B, K]
        verify_ms = self._verify_ms(batch_tokens, it.context_tokens)
        chosen = best_window(
            torch.tensor([betas[i] for i in rows], dtype=torch.float64),
            windows,
            self.draft_step_ms or 0.0,
            verify_ms[rows],
        )
        for i, k in zip(rows, chosen.tolist(), strict=True):
            states[i].window = k

    def _verify_ms(self, batch_tokens: torch.Tensor, context_tokens: int) -> torch.Tensor:
        """[B, K] float64: `predict_verify_ms(batch_tokens, context_tokens)` for every entry,
        evaluated on the fitted coefficients in one go (same model and clamp at 0). Constant 1
        before the first observation."""
        latency = self.verify_latency.predict_tensor(batch_tokens.double(), context_tokens)
        if latency is None:
            return torch.ones(batch_tokens.shape, dtype=torch.float64)
        return latency


def _tokens_upto(cands: Candidates, max_depth: int, width: int) -> torch.Tensor:
    """[B, max_depth + 1] int64: tokens request b verifies with window d, its root included:
    1 + its nodes of depth <= d in the width-`width` beam (a depth-d beam is the depth-max beam
    cut at d, as each level's beam depends only on the levels above)."""
    shaped = restrict_to_shape(cands, max_depth, width)
    depth = torch.where(shaped.valid, cands.depth, 0).clamp(max=max_depth)  # [B, N], 0 = unused
    per_level = torch.zeros(cands.num_requests, max_depth + 1, dtype=torch.int64)
    per_level.scatter_add_(1, depth.cpu(), shaped.valid.long().cpu())
    per_level[:, 0] = 1  # the root, in place of the unused nodes counted at level 0
    return per_level.cumsum(dim=1)
