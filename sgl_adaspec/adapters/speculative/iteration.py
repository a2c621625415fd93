"""The one declared state of a speculative iteration in the server, shared by the SGLang hooks
that take part in it (`hooks`, `early_exit`; the torch attention backend reads its `layout`).

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
from sgl_adaspec.adapters.platform.cpu.verify_layout import VerifyLayout, verify_layout_scope
from sgl_adaspec.speculative.driver import DraftPlan
from sgl_adaspec.speculative.policies.base import Decision, IterationInput


@dataclass
class Iteration:
    """One speculative iteration's state: every hook of the iteration reads and writes it here
    (`current_iteration()`), nothing is left on SGLang's objects.
    - plan: the draft the iteration runs (its tier's shape: `tier_states`; depth 0: plain),
      with the SLO state it was planned for; None until planned (or on an idle batch);
    - draft_forward_ran: the draft ran eagerly (`draft_forward`), not as a graph replay;
    - path_prob [bs, ntok-1]: f of SGLang's candidate nodes, in its node order (root excluded);
    - parents [bs, ntok] int64 (the draft's device): its tree's parent links
      (`tree.verify_tree_parents`);
    - policy_input / decision: what the policy saw and decided;
    - keep [bs, ntok] bool: nodes verified (closed under parent, roots included);
    - layout: what the torch attention backend is told of the verify and found
      (`platform.cpu.verify_layout`);
    - early_exit_counts: (tested, exited, test_ms) of the verify pass's early exit;
    - verify_ms / accepted [bs]: the verify pass's latency and accept lengths;
    - deepest_accepted: computes [bs], each request's deepest accepted candidate node (-1:
      none), on the host once the verify's results landed (`tree.deepest_accepted`); None
      when unknown;
    - ragged_verify: the verify forward ran on the kept nodes only (`hooks.target_forward`);
    - extend_replayed: the draft extend ran as a graph replay;
    - verify_replayed: the target's verify ran as a graph replay (the whole tree)."""

    plan: DraftPlan | None = None
    draft_forward_ran: bool = False
    path_prob: torch.Tensor | None = None
    parents: torch.Tensor | None = None
    policy_input: IterationInput | None = None
    decision: Decision | None = None
    keep: torch.Tensor | None = None
    layout: VerifyLayout = field(default_factory=VerifyLayout)
    early_exit_counts: tuple[int, int, float] | None = None
    verify_ms: float | None = None
    accepted: torch.Tensor | None = None
    deepest_accepted: Callable[[], torch.Tensor | None] | None = None
    ragged_verify: bool = False
    extend_replayed: bool = False
    verify_replayed: bool = False

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
        with verify_layout_scope(scope.layout):
            yield scope
    finally:
        _ITERATION.reset(token)
