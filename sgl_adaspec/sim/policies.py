"""Simulator adapters of the speculation policies: how each one drafts and selects per iteration.

Each adapter turns the running batch into a `Decision` (draft forwards to pay for, the candidate
trees, the selected nodes, the tokens verified per request) and learns from the outcome. The
selection itself is the server's code: `select_static` for SGLang's EAGLE-2 tree,
`AdaservePolicy.select` (adaptive shape, A(r), `select_adaserve`) for adaserve.

- `none`: no speculation; one token per request per forward.
- `static`: SGLang's fixed EAGLE tree, beam depth 5, width 4, each request's top-7 nodes by f
  (`--speculative-num-steps 5 --speculative-eagle-topk 4 --speculative-num-draft-tokens 8`,
  SGLang's automatic choice for Llama).
- `sglang-adaptive`: SGLang's `--speculative-adaptive` in spirit: a chain (topk 1) whose length
  is picked per batch-size tier from an EMA of accepted draft tokens (see `AdaptiveSteps`).
- `adaserve`: `AdaservePolicy` with the budget at the knee of the preset's verify curve; the
  draft runs the tree shape the policy plans for the batch size (AdaServe's design; the server's
  EAGLE draft still runs the configured shape, see docs/adaserve.md), or the configured maximum
  shape with `draft="configured"`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal, Protocol

import numpy as np
import torch

from sgl_adaspec.config import AdaspecConfig

from sgl_adaspec.scheduler.slo import SloBatch
from sgl_adaspec.sim.trees import SampledTrees
from sgl_adaspec.speculative.adaptive import AdaptiveTreeConfig
from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.policies import build_policy
from sgl_adaspec.speculative.policies.adaserve import AdaserveConfig, AdaservePolicy
from sgl_adaspec.speculative.policies.base import IterationInput, PolicyBase
from sgl_adaspec.speculative.selection import select_static

# draft(depth, width) -> the batch's sampled candidate trees of that beam shape.
Drafter = Callable[[int, int], SampledTrees]


@dataclass(frozen=True)
class Decision:
    """- draft_forward_tokens: batch tokens of each draft forward this iteration (empty: none);
    - trees / selected [B, N] bool: candidate trees and the nodes sent to verification (None
      without speculation);
    - verified [B] int64: tokens each request verifies, root included;
    - depth, width, budget: the shape drafted and the budget applied (for statistics)."""

    draft_forward_tokens: tuple[int, ...]
    trees: SampledTrees | None
    selected: np.ndarray | None
    verified: np.ndarray
    depth: int = 0
    width: int = 0
    budget: int | None = None


class SimPolicy(Protocol):
    name: str
    speculates: bool  # pays a draft prefill and draft steps

    def decide(
        self, slo: SloBatch, draft: Drafter, rids: tuple[str, ...], context_lens: np.ndarray
    ) -> Decision:
        """rids [B]: stable request ids; context_lens [B]: tokens in each request's KV."""

    def observe(
        self, decision: Decision, accepted: np.ndarray, latency_ms: float, verify_ms: float
    ) -> None:
        """accepted [B]: draft tokens accepted per request (bonus not counted)."""


def _beam_forwards(num_requests: int, depth: int, width: int) -> tuple[int, ...]:
    """Draft forwards of a depth x width beam: step 1 over the roots, later steps over the
    n * w frontier nodes."""
    return (num_requests,) + (num_requests * width,) * (depth - 1)


def _plain(num_requests: int) -> Decision:
    return Decision((), None, None, np.ones(num_requests, dtype=np.int64))


@dataclass
class NoSpeculation:
    name: str = "none"
    speculates: bool = False

    def decide(self, slo: SloBatch, draft: Drafter, *_batch) -> Decision:
        return _plain(slo.num_requests)

    def observe(self, decision, accepted, latency_ms, verify_ms) -> None:
        pass


@dataclass
class StaticTree:
    depth: int = 5
    width: int = 4
    num_draft_tokens: int = 8  # SGLang's count: root included
    name: str = "static"
    speculates: bool = True

    def decide(self, slo: SloBatch, draft: Drafter, *_batch) -> Decision:
        trees = draft(self.depth, self.width)
        selection = select_static(trees.candidates(), self.num_draft_tokens - 1)
        return Decision(
            _beam_forwards(slo.num_requests, self.depth, self.width),
            trees,
            selection.mask.numpy(),
            selection.num_tokens.numpy(),
            self.depth,
            self.width,
        )

    def observe(self, decision, accepted, latency_ms, verify_ms) -> None:
        pass


# SGLang 0.5.23's default tiers of `--speculative-adaptive`:
# batch size -> (chain lengths, margin of the step-down threshold).
SGLANG_ADAPTIVE_TIERS: dict[int, tuple[tuple[int, ...], float]] = {
    1: ((1, 3, 5, 7), -0.25),
    8: ((0, 1, 3), 0.0),
    32: ((0, 1), 0.0),
    64: ((0,), 0.0),
}


@dataclass
class _StepTier:
    """One batch-size tier: its chain-length choices, step-down margin, current length and
    accept-length EMA."""

    choices: tuple[int, ...]
    down_margin: float
    steps: int
    ema_accepted: float
    batches: int = 0


@dataclass
class AdaptiveSteps:
    """Chain length from an EMA of accepted draft tokens, per batch-size tier.

    Each batch routes to the tier with the largest batch-size key <= n. After every verify the
    tier's EMA (weight `ema_weight`) takes the batch's mean accepted drafts (while drafting).
    After `warmup` batches, every `interval`-th batch re-decides: from 0 steps, probe the next
    choice up; otherwise step down while the EMA is at most (lower choice - 0.5) (0.5 when the
    lower choice is 0) plus the tier's margin, and if it did not go down, step up while the EMA
    exceeds (current - 0.5): one more step than is being accepted is worth probing.
    """

    tiers: dict[int, tuple[tuple[int, ...], float]] = field(
        default_factory=lambda: dict(SGLANG_ADAPTIVE_TIERS)
    )
    initial_steps: int = 3
    ema_weight: float = 0.2
    warmup: int = 10
    interval: int = 5
    name: str = "sglang-adaptive"
    speculates: bool = True

    def __post_init__(self) -> None:
        self._keys = sorted(self.tiers)
        self._state = {}
        for key in self._keys:
            listed, down_margin = self.tiers[key]
            choices = tuple(sorted(set(listed)))
            middle = choices[len(choices) // 2]
            steps = self.initial_steps if self.initial_steps in choices else middle
            self._state[key] = _StepTier(choices, down_margin, steps, float(steps - 1))

    def tier(self, num_requests: int) -> _StepTier:
        key = max([k for k in self._keys if k <= num_requests], default=self._keys[0])
        return self._state[key]

    def decide(self, slo: SloBatch, draft: Drafter, *_batch) -> Decision:
        num_requests = slo.num_requests
        steps = self.tier(num_requests).steps
        if steps == 0:
            return _plain(num_requests)
        trees = draft(steps, 1)
        selected = np.ones(trees.parents.shape, dtype=bool)  # the whole chain is verified
        verified = np.full(num_requests, steps + 1, dtype=np.int64)
        return Decision((num_requests,) * steps, trees, selected, verified, steps, 1)

    def observe(self, decision, accepted, latency_ms, verify_ms) -> None:
        tier = self.tier(len(decision.verified))
        if tier.steps > 0:
            w = self.ema_weight
            tier.ema_accepted = (1 - w) * tier.ema_accepted + w * float(accepted.mean())
        tier.batches += 1
        if tier.batches > self.warmup and (tier.batches - self.warmup) % self.interval == 0:
            self._redecide(tier)

    def _redecide(self, tier: _StepTier) -> None:
        i = tier.choices.index(tier.steps)
        if tier.steps == 0:
            i = min(i + 1, len(tier.choices) - 1)
            tier.steps = tier.choices[i]
            if tier.steps > 0 and tier.ema_accepted < 0:
                tier.ema_accepted = float(tier.steps - 1)
            return
        start = i
        while i > 0:
            lower = tier.choices[i - 1]
            threshold = (0.5 if lower == 0 else lower - 0.5) + tier.down_margin
            if tier.ema_accepted > threshold:
                break
            i -= 1
        if i == start:
            while i < len(tier.choices) - 1 and tier.ema_accepted > tier.choices[i] - 0.5:
                i += 1
        tier.steps = tier.choices[i]


@dataclass
class Adaserve:
    config: AdaserveConfig
    draft_shape: Literal["planned", "configured"] = "planned"
    name: str = "adaserve"
    speculates: bool = True

    def __post_init__(self) -> None:
        self.policy = AdaservePolicy(self.config)

    def decide(self, slo: SloBatch, draft: Drafter, *_batch) -> Decision:
        num_requests = slo.num_requests
        tree = self.config.tree
        if self.draft_shape == "planned":
            depth, width = self.policy.draft_shape(num_requests, tree.max_depth, tree.max_width)
        else:
            depth, width = tree.max_depth, tree.max_width
        trees = draft(depth, width)
        selection, _required, plan = self.policy.select(trees.candidates(), slo)
        return Decision(
            _beam_forwards(num_requests, depth, width),
            trees,
            selection.mask.numpy(),
            selection.num_tokens.numpy(),
            plan.depth,
            plan.width,
            plan.budget,
        )

    def observe(self, decision, accepted, latency_ms, verify_ms) -> None:
        self.policy.observe_iteration(latency_ms)
        self.policy.observe_verify(verify_ms)
        self.policy.stats.observe_iteration(
            decision.verified.tolist(),
            (accepted + 1).tolist(),
            decision.budget,
            decision.depth,
            decision.width,
        )


@dataclass
class ServerPolicy:
    """Any server policy (`speculative/policies`) deciding on the candidates SGLang's EAGLE
    draft hands it with the static baseline's flags (steps 5, topk 4, 8 draft tokens), exactly
    as the SGLang adapter drives it (decide, then observe)."""

    policy: PolicyBase
    name: str
    depth: int = 5
    width: int = 4
    num_draft_tokens: int = 8  # SGLang's count: root included
    speculates: bool = True

    def decide(
        self, slo: SloBatch, draft: Drafter, rids: tuple[str, ...], context_lens: np.ndarray
    ) -> Decision:
        # The draft runs at the policy's shape, as the server's draft tiers run it.
        depth, width = self.policy.draft_shape(slo.num_requests, self.depth, self.width)
        trees = draft(depth, width)
        # What SGLang hands the policy: its rerank keeps each request's top nodes by f.
        full = trees.candidates()
        kept = select_static(full, self.num_draft_tokens - 1).mask
        cands = Candidates(full.tokens, full.parents, full.path_prob, kept)
        it = IterationInput(cands, slo, rids, torch.from_numpy(context_lens), depth, width)
        decision = self.policy.decide(it)
        self._batch = (rids, int(context_lens.sum()), depth)
        return Decision(
            _beam_forwards(slo.num_requests, depth, width),
            trees,
            decision.selection.mask.numpy(),
            decision.selection.num_tokens.numpy(),
            decision.depth,
            decision.width,
            decision.budget,
        )

    def observe(self, decision, accepted, latency_ms, verify_ms) -> None:
        rids, context, depth = self._batch
        verified = torch.from_numpy(decision.verified)
        committed = torch.from_numpy(accepted + 1)
        self.policy.observe_verify(verify_ms, int(verified.sum()), context)
        self.policy.observe_outcome(rids, verified, committed)
        self.policy.observe_iteration(latency_ms, depth)
        self.policy.stats.observe_iteration(
            verified.tolist(), committed.tolist(), decision.budget, decision.depth, decision.width
        )


# The other seed systems, run through `ServerPolicy`.
SERVER_POLICY_NAMES = ("adaspec", "tetris", "faser", "dropin")
POLICY_NAMES = ("none", "static", "sglang-adaptive", "adaserve") + SERVER_POLICY_NAMES
# Not in the default sweep: adaserve whose draft always runs the configured maximum shape
# (D_max x W_max) and only selection adapts, as the server does with --draft-tiers off.
EXTRA_POLICY_NAMES = ("adaserve-full-draft",)


def adaserve_config(budget: int, baseline_tpot_ms: float) -> AdaserveConfig:
    """The simulator's adaserve settings: budget B, the verify share of the depth rule B1 = B
    (AdaptiveTreeConfig's advice: B1 near the knee), the baseline TPOT of the latency model."""
    return AdaserveConfig(
        budget=budget,
        baseline_tpot_ms=baseline_tpot_ms,
        tree=AdaptiveTreeConfig(verify_tokens_per_step=budget),
    )


def make_policy(name: str, budget: int, baseline_tpot_ms: float) -> SimPolicy:
    if name == "none":
        return NoSpeculation()
    if name == "static":
        return StaticTree()
    if name == "sglang-adaptive":
        return AdaptiveSteps()
    if name == "adaserve":
        return Adaserve(adaserve_config(budget, baseline_tpot_ms))
    if name in SERVER_POLICY_NAMES:
        policy = build_policy(AdaspecConfig(spec_policy=name, baseline_tpot_ms=baseline_tpot_ms))
        return ServerPolicy(policy, name)
    if name == "adaserve-full-draft":
        return Adaserve(adaserve_config(budget, baseline_tpot_ms), "configured", name)
    names = ", ".join(POLICY_NAMES + EXTRA_POLICY_NAMES)
    raise KeyError(f"unknown simulator policy {name!r}; choose one of: {names}")
