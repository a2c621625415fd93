"""Simulator adapters of the speculation policies: how each one drafts and selects per iteration.

Each adapter turns the running batch into a `SimStep` (draft forwards to pay for, the candidate
trees, the selected nodes, the tokens verified per request) and learns from the outcome. The
server's policies run through the server's own `IterationDriver` (`ServerPolicy`). The
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

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from sgl_adaspec.config import AdaspecConfig
from sgl_adaspec.scheduler.slo import SloBatch
from sgl_adaspec.sim.trees import SampledTrees
from sgl_adaspec.speculative.adaserve.config import AdaserveConfig
from sgl_adaspec.speculative.adaserve.policy import AdaservePolicy
from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.driver import IterationDriver, VerifyResult
from sgl_adaspec.speculative.policies import SHAPING_POLICIES, build_policy
from sgl_adaspec.speculative.policies.base import IterationInput, PolicyBase
from sgl_adaspec.speculative.selection import select_static

# draft(depth, width) -> the batch's sampled candidate trees of that beam shape.
Drafter = Callable[[int, int], SampledTrees]


@dataclass(frozen=True)
class SimStep:
    """What the engine runs in one decode iteration.
    - draft_forward_tokens: batch tokens of each draft forward this iteration (empty: none);
    - trees / selected [B, N] bool: candidate trees and the nodes sent to verification (None
      without speculation);
    - verified [B] int64: tokens each request verifies, root included;
    - depth, width, budget: the shape drafted and the budget applied (for statistics);
    - warm_draft: without speculation, the draft extend still ran (SGLang's own adaptive steps
      0 does; the plugin's plain iterations skip it, which leaves the draft stale: engine.py)."""

    draft_forward_tokens: tuple[int, ...]
    trees: SampledTrees | None
    selected: np.ndarray | None
    verified: np.ndarray
    depth: int = 0
    width: int = 0
    budget: int | None = None
    warm_draft: bool = False


class SimPolicy(Protocol):
    name: str
    speculates: bool  # pays a draft prefill and draft steps

    def decide(
        self, slo: SloBatch, draft: Drafter, rids: tuple[str, ...], context_lens: np.ndarray
    ) -> SimStep:
        """rids [B]: stable request ids; context_lens [B]: tokens in each request's KV."""

    def draft_prefills(self, new_requests: int) -> bool:
        """Asked at each prefill of a speculating policy: whether the draft prefills the
        `new_requests` new requests (`PolicyBase.draft_prefills`); those it does not are blind
        to it for life."""

    def observe(
        self,
        step: SimStep,
        accept_lens: np.ndarray,
        latency_ms: float,
        verify_ms: float,
        deepest: np.ndarray | None = None,
        after_prefill: bool = False,
        stall_ms: float = 0.0,
    ) -> None:
        """accept_lens [B]: tokens each request committed, bonus included, as SGLang's
        `accept_lens` and `VerifyResult.accept_lens` (1 in a plain iteration); deepest [B]:
        each request's deepest accepted node (-1: none; None without speculation);
        after_prefill: a prefill ran just before this iteration (`Outcome.after_prefill`);
        stall_ms: prefill time the running requests waited on since their last iteration
        (`Outcome.stall_ms`)."""


def _beam_forwards(num_requests: int, depth: int, width: int) -> tuple[int, ...]:
    """Draft forwards of a depth x width beam: step 1 over the roots, later steps over the
    n * w frontier nodes."""
    return (num_requests,) + (num_requests * width,) * (depth - 1)


def _plain(num_requests: int, warm: bool = False) -> SimStep:
    """A plain iteration; `warm`: the draft extend still runs, one draft forward over the
    requests' new tokens (priced as a draft step), and keeps the draft's state."""
    forwards = (num_requests,) if warm else ()
    return SimStep(forwards, None, None, np.ones(num_requests, dtype=np.int64), warm_draft=warm)


@dataclass
class NoSpeculation:
    name: str = "none"
    speculates: bool = False

    def decide(self, slo: SloBatch, draft: Drafter, *_batch) -> SimStep:
        return _plain(slo.num_requests)

    def draft_prefills(self, new_requests: int) -> bool:
        return True

    def observe(self, step, accept_lens, *_rest) -> None:
        pass  # learns nothing


@dataclass
class StaticTree:
    depth: int = 5
    width: int = 4
    num_draft_tokens: int = 8  # SGLang's count: root included
    name: str = "static"
    speculates: bool = True

    def draft_prefills(self, new_requests: int) -> bool:
        return True

    def decide(self, slo: SloBatch, draft: Drafter, *_batch) -> SimStep:
        trees = draft(self.depth, self.width)
        selection = select_static(trees.candidates(), self.num_draft_tokens - 1)
        return SimStep(
            _beam_forwards(slo.num_requests, self.depth, self.width),
            trees,
            selection.mask.numpy(),
            selection.num_tokens.numpy(),
            self.depth,
            self.width,
        )

    def observe(self, step, accept_lens, *_rest) -> None:
        pass  # learns nothing


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

    def draft_prefills(self, new_requests: int) -> bool:
        return True

    def tier(self, num_requests: int) -> _StepTier:
        key = max([k for k in self._keys if k <= num_requests], default=self._keys[0])
        return self._state[key]

    def decide(self, slo: SloBatch, draft: Drafter, *_batch) -> SimStep:
        num_requests = slo.num_requests
        steps = self.tier(num_requests).steps
        if steps == 0:  # its draft extend still runs ("keeping draft KV warm")
            return _plain(num_requests, warm=True)
        trees = draft(steps, 1)
        selected = np.ones(trees.parents.shape, dtype=bool)  # the whole chain is verified
        verified = np.full(num_requests, steps + 1, dtype=np.int64)
        return SimStep((num_requests,) * steps, trees, selected, verified, steps, 1)

    def observe(self, step, accept_lens, *_rest) -> None:
        tier = self.tier(len(step.verified))
        if tier.steps > 0:
            w = self.ema_weight
            drafts = float(accept_lens.mean()) - 1.0  # accepted draft tokens, bonus excluded
            tier.ema_accepted = (1 - w) * tier.ema_accepted + w * drafts
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
class ServerPolicy:
    """Any server policy (`speculative/policies`) driven by the server's `IterationDriver`:
    `plan` before the draft (depth 0: a plain decode), `decide` on the candidates, then one
    `observe` of the outcome.
    - depth / width: the configured draft search (--speculative-num-steps / -eagle-topk);
    - num_draft_tokens: SGLang's rerank keeps each request's top nodes by f, root included
      (--speculative-num-draft-tokens); None: every drafted node is a candidate;
    - planned_shape: the draft runs the policy's shape (draft tiers on) or the configured one
      (off; a depth of 0 is honoured either way, as on the server);
    - layout_promise: the candidates say they are a beam search's, laid out level by level
      (`Candidates.beam`); False: they say nothing of it but their nodes' depths, as those the
      SGLang adapter builds from SGLang's verify tree, so a policy that narrows them to a
      shape checks or searches for it."""

    policy: PolicyBase
    name: str
    depth: int = 5
    width: int = 4
    num_draft_tokens: int | None = 8
    planned_shape: bool = True
    speculates: bool = True
    layout_promise: bool = True

    def __post_init__(self) -> None:
        self.driver = IterationDriver(self.policy, clock=_host_clock, first_draft_warms_up=False)
        self._pending: tuple = ()

    @property
    def critical_s(self) -> float:
        """Host seconds of the last iteration's `decide`, between its draft and its verify (0
        for a plain one); the engine charges them with `EngineConfig.charge_critical_path`."""
        return self.driver.critical_s

    def decide(
        self, slo: SloBatch, draft: Drafter, rids: tuple[str, ...], context_lens: np.ndarray
    ) -> SimStep:
        num_requests = slo.num_requests
        configured = (self.depth, self.width)
        plan = self.driver.plan(
            num_requests, configured, slo,
            runs_in=None if self.planned_shape else (lambda asked: configured),
        )  # fmt: skip
        context = int(context_lens.sum())
        self._pending = (plan, None, None, rids, context)
        if plan.plain:
            return _plain(num_requests, warm=plan.keep_warm)
        depth, width = plan.depth, plan.width
        trees = draft(depth, width)
        cands = trees.candidates()
        if not self.layout_promise:
            cands = Candidates.trusted(
                cands.tokens, cands.parents, cands.path_prob, cands.valid, depth=cands.depth
            )
        if self.num_draft_tokens is not None:
            kept = select_static(cands, self.num_draft_tokens - 1).mask
            cands = cands.derived(valid=kept)  # a top-k by f is closed under parent
        it = IterationInput(cands, slo, rids, context, depth, width)
        decision = self.driver.decide(it)
        self._pending = (plan, it, decision, rids, context)
        return SimStep(
            _beam_forwards(num_requests, depth, width),
            trees,
            decision.selection.mask.numpy(),
            decision.selection.num_tokens.numpy(),
            decision.depth,
            decision.width,
            int(decision.budget),
        )

    def draft_prefills(self, new_requests: int) -> bool:
        return self.driver.draft_prefills(new_requests)

    def observe(
        self,
        step,
        accept_lens,
        latency_ms,
        verify_ms,
        deepest=None,
        after_prefill=False,
        stall_ms=0.0,
    ) -> None:
        plan, it, decision, rids, context = self._pending
        result = VerifyResult(
            accept_lens=torch.from_numpy(accept_lens),
            verify_ms=verify_ms,
            iteration_ms=latency_ms,
            rids=rids,
            context_tokens=context,
            deepest_accepted=None if deepest is None else torch.from_numpy(deepest),
            after_prefill=after_prefill,
            stall_ms=stall_ms,
        )
        self.driver.observe(plan, result, it, decision)


def adaserve_sim(config: AdaserveConfig, name: str = "adaserve", planned: bool = True):
    """adaserve over the whole drafted tree of the configured maximum shape (D_max x W_max)."""
    tree = config.tree
    return ServerPolicy(AdaservePolicy(config), name, tree.max_depth, tree.max_width, None, planned)


# The simulator's baselines, then the plugin's policies from the registry (adaserve through
# `adaserve_sim`, the other seed systems through `ServerPolicy`).
BASELINE_POLICY_NAMES = ("none", "static", "sglang-adaptive")
SERVER_POLICY_NAMES = tuple(name for name in SHAPING_POLICIES if name != "adaserve")
POLICY_NAMES = BASELINE_POLICY_NAMES + SHAPING_POLICIES
# Not in the default sweep: adaserve whose draft always runs the configured maximum shape
# (D_max x W_max) and only selection adapts, as the server does with --draft-tiers off; adaserve
# with the paper's knee budget and eq. 8 depth instead of the cost rule.
EXTRA_POLICY_NAMES = ("adaserve-full-draft", "adaserve-knee")


def adaserve_config(budget: int, baseline_tpot_ms: float, rule: str = "cost") -> AdaserveConfig:
    """The simulator's adaserve settings, as the server builds them: the knee `budget` is B
    under the knee rule (the cost rule sizes B itself), the depth rule's B1 = the knee
    (AdaptiveTreeConfig's advice), the baseline TPOT of the latency model."""
    config = AdaserveConfig(baseline_tpot_ms=baseline_tpot_ms, budget_rule=rule)
    return config.with_profile_budget(budget)


def make_policy(name: str, budget: int, baseline_tpot_ms: float) -> SimPolicy:
    if name == "none":
        return NoSpeculation()
    if name == "static":
        return StaticTree()
    if name == "sglang-adaptive":
        return AdaptiveSteps()
    if name == "adaserve":
        return adaserve_sim(adaserve_config(budget, baseline_tpot_ms))
    if name in SERVER_POLICY_NAMES:
        policy = build_policy(AdaspecConfig(spec_policy=name, baseline_tpot_ms=baseline_tpot_ms))
        return ServerPolicy(policy, name)
    if name == "adaserve-knee":
        return adaserve_sim(adaserve_config(budget, baseline_tpot_ms, "knee"), name)
    if name == "adaserve-full-draft":
        return adaserve_sim(adaserve_config(budget, baseline_tpot_ms), name, planned=False)
    names = ", ".join(POLICY_NAMES + EXTRA_POLICY_NAMES)
    raise KeyError(f"unknown simulator policy {name!r}; choose one of: {names}")


def _host_clock() -> float:
    """The engine's host clock (tests replace `engine.host_clock`), read where it is now."""
    from sgl_adaspec.sim import engine

    return engine.host_clock()
