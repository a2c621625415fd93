"""The one declared state of a speculative iteration in the server, shared by the SGLang hooks
that take part in it (`hooks`, `early_exit`, the torch attention backend).

The hooks run nested inside `EAGLEWorkerV2.forward_batch_generation` on the scheduler's thread,
so a context variable scoped to that call carries the state; scopes refuse to nest.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import torch

from sgl_adaspec.platform.cpu.graph_emulation import sealed
from sgl_adaspec.scheduler.slo import SloBatch
from sgl_adaspec.speculative.policies.base import Decision, IterationInput


@dataclass
class Iteration:
    """One speculative iteration's state: every hook of the iteration reads and writes it here
    (`current_iteration()`), nothing is left on SGLang's objects.
    - slo: the running requests' SLO state, taken once as the iteration starts;
    - plain: the iteration runs without speculation (the policy's draft depth was 0);
    - draft_shape: the (depth, width) the iteration runs with (its draft tier, `tier_states`;
      depth 0: plain); draft_ran: the draft's shape (the configured one without tiers);
      draft_forward_ran: the draft ran eagerly (`draft_forward`), not as a graph replay;
    - path_prob [bs, ntok-1]: f of SGLang's candidate nodes, in its node order (root excluded);
    - parents [bs, ntok] int64 (the draft's device): its tree's parent links
      (`tree.verify_tree_parents`);
    - policy_input / decision: what the policy saw and decided;
    - keep [bs, ntok] bool: nodes verified (closed under parent, roots included);
    - verify_nodes: per request, the kept node indices, while the ragged verify forward runs
      (read by the torch attention backend);
    - early_exit_counts: (tested, exited, test_ms) of the verify pass's early exit;
    - verify_ms / accepted [bs]: the verify pass's latency and accept lengths;
    - deepest_accepted [bs]: each request's deepest accepted candidate node (-1: none), None
      when unknown (`tree.deepest_accepted`);
    - ragged_verify: the verify forward ran on the kept nodes only (`hooks.target_forward`);
    - extend_replayed: the draft extend ran as a graph replay;
    - verify_replayed: the target's verify ran as a graph replay (the whole tree);
    - one_token_slots_in_row: a one-node verify's KV slots follow each request's prefix in
      its `req_to_token` row (the torch attention backend's check; None: not yet asked)."""

    slo: SloBatch | None = None
    plain: bool = False
    draft_shape: tuple[int, int] | None = None
    draft_ran: tuple[int, int] | None = None
    draft_forward_ran: bool = False
    path_prob: torch.Tensor | None = None
    parents: torch.Tensor | None = None
    policy_input: IterationInput | None = None
    decision: Decision | None = None
    keep: torch.Tensor | None = None
    verify_nodes: list[torch.Tensor] | None = None
    early_exit_counts: tuple[int, int, float] | None = None
    verify_ms: float | None = None
    accepted: torch.Tensor | None = None
    deepest_accepted: torch.Tensor | None = None
    one_token_slots_in_row: bool | None = None
    ragged_verify: bool = False
    extend_replayed: bool = False
    verify_replayed: bool = False


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
    token = _ITERATION.set(Iteration())
    try:
        yield _ITERATION.get()
    finally:
        _ITERATION.reset(token)
