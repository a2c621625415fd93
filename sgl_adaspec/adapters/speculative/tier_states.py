"""Draft tiers as SGLang runtime states: one per (depth, width), built at start-up by SGLang
0.5.23's own `EAGLEWorkerV2.build_adaptive_runtime_state` (the `--speculative-adaptive`
machinery) and swapped per iteration (`in_tier`).

A state holds what one shape needs: the draft's multi-step attention and draft-extend backends,
the target's verify backend and, on CUDA, their captured graphs (SGLang's graph runners). The
builder keys a state on its step count and keeps topk; the plugin builds each tier with topk
set to the tier's width, and its swap also sets topk, which SGLang's `apply_runtime_state` does
not (it also returns early when the step counts match). On CPU the same builder makes the same
states with graphs disabled, so every line here runs in the CPU tests.

Inside a tier the draft runs the tier's beam search, the target verifies the tier's N' nodes
with the tier's backend, and the draft extend runs at the configured width (`extend_width`):
its top-k is the next draft's first step, which any tier then narrows to its own width (the
top-k is sorted). Steps 0 is the plain decode that keeps the draft warm (`plain_decode`).
Chain tiers (width 1) keep no draft graph: SGLang's topk-1 path, captured or not, keeps no path
probabilities, so their draft runs the plugin's eager beam (`sglang.draft_tiers`) on every
device, and their verify and extend graphs are used.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sgl_adaspec.adapters.platform.cpu.graph_emulation import emulated_tier_verify_runner
from sgl_adaspec.adapters.speculative.fallbacks import Fallback, fell_back
from sgl_adaspec.speculative.draft_tiers import Shape, covering_tier, tier_draft_tokens

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TierStates:
    """The worker's built tiers: shape -> SGLang runtime state, the configured shape included
    (`configured`, at `num_draft_tokens`). `memory_gb`: device memory the extra states took
    (their graphs; 0 where graphs are disabled)."""

    configured: Shape
    num_draft_tokens: int
    states: Mapping[Shape, Any]
    memory_gb: float
    graphs: bool

    @property
    def shapes(self) -> tuple[Shape, ...]:
        return tuple(self.states)

    def covering(self, shape: Shape) -> Shape | None:
        """The built tier an iteration asking for `shape` runs in (`covering_tier`)."""
        return covering_tier(shape, self.shapes, self.num_draft_tokens)


def build_tier_states(
    worker,
    shapes: tuple[Shape, ...],
    memory_cap_gb: float | None = None,
    agree: Callable[[bool], bool] = lambda stop: stop,
    time_cap_s: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> TierStates | None:
    """A runtime state per shape of `shapes` (the first is the configured one, taken as it
    stands), built in order until their graphs have taken more than `memory_cap_gb` or the
    builds more than `time_cap_s` seconds (the tier that crosses a cap is kept: its cost is
    spent). `agree`: rank 0's stop decision on every
    rank of a TP group (graph captures are collective, so all ranks build the same tiers).
    None where this worker cannot build states (the tiers and warm plain iterations are then
    off)."""
    steps, topk = worker.speculative_num_steps, worker.topk
    num_draft_tokens = worker.speculative_num_draft_tokens
    if not hasattr(worker, "build_adaptive_runtime_state") or steps == 0:
        return None
    from sglang.srt.utils import get_available_gpu_memory

    configured = _current_state(worker)
    states = {(steps, topk): configured}
    graphs = any(
        runner is not None
        for runner in (
            configured.cuda_graph_runner,
            configured.target_graph_runner,
            configured.cuda_graph_runner_for_draft_extend,
        )
    )
    used_gb, started = 0.0, clock()
    try:
        for shape in shapes:
            if shape in states:
                continue
            before = get_available_gpu_memory(worker.device, worker.gpu_id) if graphs else 0.0
            state = _build(worker, shape, num_draft_tokens)
            cost = before - get_available_gpu_memory(worker.device, worker.gpu_id) if graphs else 0
            states[shape] = state
            used_gb += max(cost, 0.0)
            used_s = clock() - started
            over_memory = memory_cap_gb is not None and used_gb > memory_cap_gb
            over_time = time_cap_s is not None and used_s > time_cap_s
            if agree(over_memory or over_time):
                logger.info(
                    "sgl_adaspec: draft tiers stop at %s: %.2f GB (--draft-tier-memory-gb %s), "
                    "%.1f s (--draft-tier-capture-s %s)", shape, used_gb, memory_cap_gb, used_s,
                    time_cap_s,
                )  # fmt: skip
                break
    except Exception as exc:  # never stop the server: it then runs the configured search only
        fell_back(Fallback.TIER_BUILD, exc)
        return None
    return TierStates((steps, topk), num_draft_tokens, states, used_gb, graphs)


def _current_state(worker):
    from sglang.srt.speculative.adaptive_runtime_state import SpecRuntimeState

    draft = worker._draft_worker
    target = worker._target_worker.model_runner
    return SpecRuntimeState(
        speculative_num_steps=worker.speculative_num_steps,
        speculative_num_draft_tokens=worker.speculative_num_draft_tokens,
        draft_attn_backend=draft.draft_attn_backend,
        cuda_graph_runner=draft.cuda_graph_runner,
        target_attn_backend=target.attn_backend,
        target_graph_runner=target.decode_cuda_graph_runner,
        draft_extend_attn_backend=draft.draft_extend_attn_backend,
        cuda_graph_runner_for_draft_extend=draft.cuda_graph_runner_for_draft_extend,
    )


def _build(worker, shape: Shape, num_draft_tokens: int):
    """SGLang's builder at the tier's steps and draft tokens, with topk at the tier's width."""
    depth, width = shape
    draft = worker._draft_worker
    configured = (worker.topk, draft.topk)
    worker.topk = draft.topk = width
    # On leaving, SGLang's builder rebuilds the chain buffers of a topk-1 worker for the
    # configured steps, which a chain tier's topk does not fit; the buffers stay the tier's.
    rebuild = draft._rebuild_topk1_chain_buffers
    draft._rebuild_topk1_chain_buffers = lambda: (
        rebuild() if draft.speculative_num_draft_tokens == draft.speculative_num_steps + 1 else None
    )
    try:
        # A chain tier drafts eagerly (see the docstring): no draft graph is captured for it.
        no_draft_graph = _no_draft_graph() if width == 1 else contextlib.nullcontext()
        with _spec_config(speculative_eagle_topk=width), no_draft_graph:
            state = worker.build_adaptive_runtime_state(
                depth, tier_draft_tokens(depth, width, num_draft_tokens)
            )
            if state.target_graph_runner is None and depth > 0:
                # CPU emulation: the tier's verify graphs as SGLang captures them on CUDA.
                state.target_graph_runner = emulated_tier_verify_runner(worker, state)
            return state
    finally:
        del draft._rebuild_topk1_chain_buffers
        worker.topk, draft.topk = configured


@contextlib.contextmanager
def _no_draft_graph():
    """SGLang's `_capture_cuda_graphs` inside captures no draft decode graph (its draft extend
    graph still): the runner class it looks up is replaced by one that builds none."""
    from sglang.srt.speculative import eagle_worker_v2

    saved = eagle_worker_v2.EAGLEDraftCudaGraphRunner
    eagle_worker_v2.EAGLEDraftCudaGraphRunner = lambda *args, **kwargs: None
    try:
        yield
    finally:
        eagle_worker_v2.EAGLEDraftCudaGraphRunner = saved


def graph_counts(state) -> dict[str, int]:
    """Graphs a runtime state holds: draft, draft extend and target verify, one per captured
    batch size (0 where the runner is absent)."""
    runners = {
        "draft": state.cuda_graph_runner,
        "extend": state.cuda_graph_runner_for_draft_extend,
        "verify": state.target_graph_runner,
    }
    return {
        name: 0 if runner is None else len(getattr(runner, "capture_bs", ()))
        for name, runner in runners.items()
    }


@contextlib.contextmanager
def _spec_config(**fields):
    """SGLang's config leaves (read by backends through `get_spec()`) set for the block, as
    SGLang's own state switch sets them; its provenance log is not grown by per-iteration
    switches."""
    from sglang.srt.runtime_context import get_context, get_spec

    context = get_context()
    saved = {name: getattr(get_spec(), name) for name in fields}
    _override(context, fields)
    try:
        yield
    finally:
        _override(context, saved)


def _override(context, fields: dict) -> None:
    log = getattr(context, "_overrides_log", None)
    size = len(log) if log is not None else 0
    context.override("sgl_adaspec.draft_tier", **fields)
    if log is not None:
        del log[size:]


def _apply(worker, state, width: int) -> None:
    """SGLang's `apply_runtime_state`, field for field, plus topk; without its early return on
    equal step counts and its per-switch log."""
    worker.speculative_num_steps = state.speculative_num_steps
    worker.speculative_num_draft_tokens = state.speculative_num_draft_tokens
    draft = worker._draft_worker
    draft.speculative_num_steps = state.speculative_num_steps
    draft.speculative_num_draft_tokens = state.speculative_num_draft_tokens
    worker.topk = draft.topk = width
    draft.draft_attn_backend = state.draft_attn_backend
    draft.draft_runner.draft_attn_backend = state.draft_attn_backend
    draft.cuda_graph_runner = state.cuda_graph_runner
    draft.draft_extend_attn_backend = state.draft_extend_attn_backend
    if state.draft_extend_attn_backend is not None:
        draft.draft_runner.attn_backend = state.draft_extend_attn_backend
    draft.cuda_graph_runner_for_draft_extend = state.cuda_graph_runner_for_draft_extend
    target = worker._target_worker.model_runner
    target.attn_backend = state.target_attn_backend
    target.decode_cuda_graph_runner = state.target_graph_runner


@contextlib.contextmanager
def in_tier(worker, tiers: TierStates, shape: Shape, draft_input=None):
    """The worker's iteration inside runs in tier `shape` (a built one); `draft_input`, the
    batch's EagleDraftInput, has its sorted top-k narrowed to the tier's width."""
    if shape == tiers.configured:
        yield
        return
    depth, width = shape
    width = width if depth > 0 else tiers.configured[1]
    state, configured = tiers.states[shape], tiers.states[tiers.configured]
    if depth > 0 and draft_input is not None and draft_input.topk_p is not None:
        draft_input.topk_p = draft_input.topk_p[:, :width].contiguous()
        draft_input.topk_index = draft_input.topk_index[:, :width].contiguous()
    _apply(worker, state, width)
    try:
        with _spec_config(
            speculative_num_steps=state.speculative_num_steps,
            speculative_num_draft_tokens=state.speculative_num_draft_tokens,
            speculative_eagle_topk=width,
        ):
            yield
    finally:
        _apply(worker, configured, tiers.configured[1])


@contextlib.contextmanager
def extend_width(draft_worker, width: int):
    """The draft extend of a tier's iteration at the configured `width` (see the docstring)."""
    saved = draft_worker.topk
    draft_worker.topk = width
    try:
        yield
    finally:
        draft_worker.topk = saved
