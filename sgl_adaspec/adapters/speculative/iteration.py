"""The one declared state of a speculative iteration in the server, shared by the SGLang hooks
that take part in it (`hooks`, `early_exit`).

The hooks run nested inside `EAGLEWorkerV2.forward_batch_generation` on the scheduler's thread,
so a context variable scoped to that call carries the state; scopes refuse to nest.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from sgl_adaspec.adapters.platform.cpu.graph_emulation import sealed
from sgl_adaspec.speculative.driver import DraftPlan
from sgl_adaspec.speculative.policies.base import Decision, IterationInput


@dataclass
class DraftRun:
    """What the draft's hooks found: whether the beam search ran eagerly (`draft_forward`, not
    a graph replay), f of SGLang's candidate nodes [bs, ntok-1] in its node order (root
    excluded), and whether the draft extend ran as a graph replay."""

    ran_eagerly: bool = False
    path_prob: torch.Tensor | None = None
    extend_replayed: bool = False


@dataclass(frozen=True)
class Verifying:
    """What `hooks.verify` decided, handed to the target's forward (`target_forward`,
    `early_exit`) and to the iteration's observe:
    - parents [bs, ntok] int64 (the draft's device): the tree's parent links
      (`tree.verify_tree_parents`; pruning only unlinks nodes, so kept nodes keep them);
    - policy_input / decision: what the policy saw and decided (None on a TP follower);
    - keep [bs, ntok] bool: nodes verified (closed under parent, roots included)."""

    parents: torch.Tensor
    policy_input: IterationInput | None
    decision: Decision | None
    keep: torch.Tensor


@dataclass
class VerifyRun:
    """What the verify pass did: its latency (None until it ran under a decision), accept
    lengths [bs], a function computing each request's deepest accepted candidate node [bs]
    (-1: none) on the host once the results landed (`tree.deepest_accepted`; None: unknown),
    the early exit's (tested, exited, test_ms), whether it ran on the kept nodes only
    (`hooks.target_forward`), whether it ran as a graph replay (the whole tree) and whether
    it ran as a plain decode's forward (one node per request on the torch attention's
    one-token path)."""

    ms: float | None = None
    accepted: torch.Tensor | None = None
    deepest_accepted: Callable[..., torch.Tensor | None] | None = None
    early_exit_counts: tuple[int, int, float] | None = None
    ragged: bool = False
    replayed: bool = False
    as_decode: bool = False


@dataclass
class Iteration:
    """One speculative iteration's state, in the order its stages hand it on; every hook of
    the iteration reads and writes it here (`current_iteration()`), nothing is left on SGLang's
    objects.
    - plan: the draft the iteration runs (its tier's shape: `tier_states`; depth 0: plain),
      with the SLO state it was planned for; None until planned (or on an idle batch);
    - draft, verifying, verified: what the draft found, what the verify decided, what the
      verify pass did (above)."""

    plan: DraftPlan | None = None
    draft: DraftRun = field(default_factory=DraftRun)
    verifying: Verifying | None = None
    verified: VerifyRun = field(default_factory=VerifyRun)

    @property
    def plain(self) -> bool:
        return self.plan is not None and self.plan.plain


_ITERATION: contextvars.ContextVar[Iteration | None] = contextvars.ContextVar(
    "adaspec_iteration", default=None
)


def current_iteration() -> Iteration | None:
    """The speculative iteration in progress in this thread, or None; None inside a captured
    region too (`graph_emulation.sealed`): on a GPU, Python there runs only at capture."""
    if sealed():
        return None
    return _ITERATION.get()


@contextlib.contextmanager
def iteration_scope():
    if _ITERATION.get() is not None:
        raise RuntimeError("speculative iterations do not nest")
    scope = Iteration()
    token = _ITERATION.set(scope)
    try:
        yield scope
    finally:
        _ITERATION.reset(token)
