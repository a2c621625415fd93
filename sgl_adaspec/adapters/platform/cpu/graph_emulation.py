"""CUDA graph capture and replay emulated on CPU, under SGLang's own graph runners.

On a GPU SGLang replays the EAGLE draft, its draft extend and the target's verify from graphs
captured at start-up (`EAGLEDraftCudaGraphRunner`, `EAGLEDraftExtendCudaGraphRunner`,
`DecodeCudaGraphRunner` in TARGET_VERIFY mode): Python inside the captured callable runs once,
at capture; a replay repeats only the captured kernels, which write into the tensors that
existed at capture. With `ADASPEC_EMULATE_GRAPHS=1` on `--device cpu`, SGLang's runner classes
are built as on CUDA (each draft tier's too), with `EmulatedGraphBackend` in place of its CUDA
graph backend. A replay runs the captured callable again over the runner's static input
buffers, in SGLang's forward context of the capture, but:
- sealed: no plugin iteration scope is reachable inside it (`sealed()`), as at capture, so a
  hook that hands a value over through Python state sees nothing, as on a GPU;
- the capture-time outputs are what the caller gets: every tensor of the rerun's outputs
  (tuple items and tensor attributes) is copied into the capture-time tensor in its place, and
  a rerun whose outputs differ in structure or shape from the capture's is an error (a
  data-dependent branch inside a captured region).
The torch attention backend stands in for SGLang's graph-safe kernels: it reads the static
batch's metadata at replay as a captured kernel reads its device buffers, and the verify's tree
mask from its own buffer, refilled before each replay as SGLang's graph-capable backends do.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import torch

logger = logging.getLogger(__name__)

EMULATE_GRAPHS_ENV = "ADASPEC_EMULATE_GRAPHS"
# Captures per graph, as SGLang's CUDA backend runs them: two warm-ups, then the capture.
WARMUP_RUNS = 2

_SEALED: contextvars.ContextVar[bool] = contextvars.ContextVar("adaspec_sealed", default=False)


def emulation_on() -> bool:
    value = os.environ.get(EMULATE_GRAPHS_ENV, "0")
    if value not in ("0", "1"):
        raise ValueError(f"{EMULATE_GRAPHS_ENV} must be 0 or 1, got {value!r}")
    return value == "1"


def sealed() -> bool:
    """Whether the code running now is a captured region (capture or emulated replay)."""
    return _SEALED.get()


@contextlib.contextmanager
def _sealed_region() -> Iterator[None]:
    token = _SEALED.set(True)
    try:
        yield
    finally:
        _SEALED.reset(token)


def tensors_of(output: Any) -> list[torch.Tensor]:
    """The tensors a graph's output holds, in a fixed order: items of tuples and lists, then
    the tensor attributes of the object itself (a tuple subclass may carry some)."""
    found: list[torch.Tensor] = []
    if torch.is_tensor(output):
        return [output]
    if isinstance(output, (tuple, list)):
        for item in output:
            found.extend(tensors_of(item))
    for name in sorted(getattr(output, "__dict__", {})):
        value = vars(output)[name]
        if torch.is_tensor(value):
            found.append(value)
    return found


class EmulatedGraphBackend:
    """SGLang's `BaseCudaGraphBackend` contract on CPU (see the module docstring)."""

    def __init__(self, runner) -> None:
        self._runner = runner
        # shape key -> (the captured callable, its capture-time output, SGLang's forward
        # context around the capture: a replay runs in it, as the kernels it baked in do)
        self._captured: dict[Any, tuple[Callable[[], Any], Any, Any]] = {}
        self.replays = 0

    @contextlib.contextmanager
    def capture_session(self, stream) -> Iterator[None]:
        yield

    def capture_one(self, shape_key, forward_fn, capture_inputs=None, post_warmup_hook=None):
        for _ in range(WARMUP_RUNS):
            with _sealed_region():
                forward_fn()
            if post_warmup_hook is not None:
                post_warmup_hook()
        with _sealed_region():
            output = forward_fn()
        self._captured[shape_key] = (forward_fn, output, _forward_context())

    def can_run(self, forward_batch, shape_key) -> bool:
        return shape_key in self._captured

    @contextlib.contextmanager
    def replay_session(self) -> Iterator[None]:
        yield

    def replay(self, shape_key, static_forward_batch, **kwargs) -> Any:
        forward_fn, output, context = self._captured[shape_key]
        with _sealed_region(), _in_forward_context(context):
            rerun = forward_fn()
        captured, fresh = tensors_of(output), tensors_of(rerun)
        if [(t.shape, t.dtype) for t in captured] != [(t.shape, t.dtype) for t in fresh]:
            raise RuntimeError(
                f"emulated graph replay of {shape_key} diverged from its capture: outputs "
                f"{[tuple(t.shape) for t in fresh]} vs {[tuple(t.shape) for t in captured]}"
            )
        with torch.no_grad():
            for target, value in zip(captured, fresh):
                if target.data_ptr() != value.data_ptr():
                    target.copy_(value)
        self.replays += 1
        return output

    def cleanup(self) -> None:
        self._captured.clear()

    @property
    def num_graphs(self) -> int:
        return len(self._captured)


def _forward_context():
    from sglang.srt.model_executor import forward_context

    return forward_context.get_forward_context() if forward_context.has_forward_context() else None


@contextlib.contextmanager
def _in_forward_context(context) -> Iterator[None]:
    from sglang.srt.model_executor import forward_context

    previous = forward_context.set_forward_context(context)
    try:
        yield
    finally:
        forward_context.set_forward_context(previous)


@contextlib.contextmanager
def _cpu_capture_context() -> Iterator[None]:
    """SGLang's capture loop with its CUDA stream and graph backend replaced for the CPU."""
    from sglang.srt.model_executor.runner import decode_cuda_graph_runner as decode
    from sglang.srt.speculative import eagle_draft_cuda_graph_runner as draft
    from sglang.srt.speculative import eagle_draft_extend_cuda_graph_runner as extend

    @contextlib.contextmanager
    def graph_capture(stream=None):
        yield SimpleNamespace(stream=stream)

    saved = (decode.graph_capture, decode.get_or_create_global_graph_capture_stream)
    saved_backends = (
        decode.resolve_decode_backend, draft.resolve_decode_backend, extend.resolve_decode_backend
    )
    decode.graph_capture = graph_capture
    decode.get_or_create_global_graph_capture_stream = lambda: None
    decode.resolve_decode_backend = EmulatedGraphBackend
    draft.resolve_decode_backend = extend.resolve_decode_backend = EmulatedGraphBackend
    try:
        yield
    finally:
        decode.graph_capture, decode.get_or_create_global_graph_capture_stream = saved
        (
            decode.resolve_decode_backend, draft.resolve_decode_backend,
            extend.resolve_decode_backend,
        ) = saved_backends  # fmt: skip


def emulated_draft_runner(draft_worker):
    """SGLang's `EAGLEDraftCudaGraphRunner` for `draft_worker`, built on CPU with emulated
    graphs, one per captured batch size."""
    from sglang.srt.speculative.eagle_draft_cuda_graph_runner import EAGLEDraftCudaGraphRunner

    with _cpu_capture_context():
        return EAGLEDraftCudaGraphRunner(draft_worker)


def emulated_extend_runner(draft_worker):
    """SGLang's `EAGLEDraftExtendCudaGraphRunner` for `draft_worker`, built on CPU with
    emulated graphs (SGLang builds it on CUDA for its graph-capable attention backends)."""
    from sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner import (
        EAGLEDraftExtendCudaGraphRunner,
    )

    _share_graph_outputs(draft_worker.draft_runner)
    with _cpu_capture_context():
        return EAGLEDraftExtendCudaGraphRunner(draft_worker)


def _share_graph_outputs(model_runner) -> None:
    """The logits buffer SGLang's graph runners of `model_runner` share (SGLang makes none on
    CPU, where its decode graphs are off)."""
    from sglang.srt.model_executor.graph_shared_output import GraphSharedOutput

    if model_runner.graph_shared_output is None:
        rows = model_runner.max_shared_logits_buffer_rows()
        model_runner.graph_shared_output = GraphSharedOutput(
            device=torch.device("cpu"), max_rows=rows
        )


def capture_cuda_graphs(original: Callable, draft_worker, *args, **kwargs):
    """AROUND `EagleDraftWorker._capture_cuda_graphs`: with `ADASPEC_EMULATE_GRAPHS=1` on the
    generic CPU path, the draft decode graphs SGLang would capture on CUDA, emulated."""
    result = original(draft_worker, *args, **kwargs)
    from sgl_adaspec.adapters.platform.cpu.hooks import on_generic_cpu

    if (
        emulation_on()
        and on_generic_cpu(draft_worker.device)
        and draft_worker.cuda_graph_runner is None
        and draft_worker.speculative_num_steps > 1
        # A chain keeps no tree (no path probabilities): its tiers draft eagerly.
        and draft_worker.topk > 1
    ):
        runner = emulated_draft_runner(draft_worker)
        draft_worker.cuda_graph_runner = runner
        logger.info(
            "sgl_adaspec: emulated draft graphs (depth %d, width %d): %d captured, batch sizes %s",
            draft_worker.speculative_num_steps, draft_worker.topk, runner.backend.num_graphs,
            runner.capture_bs,
        )  # fmt: skip
    if (
        emulation_on()
        and on_generic_cpu(draft_worker.device)
        and draft_worker.cuda_graph_runner_for_draft_extend is None
        and draft_worker.draft_extend_attn_backend is not None
    ):
        runner = emulated_extend_runner(draft_worker)
        draft_worker.cuda_graph_runner_for_draft_extend = runner
        logger.info(
            "sgl_adaspec: emulated draft extend graphs (%d tokens a request): %d captured",
            draft_worker.speculative_num_draft_tokens, runner.backend.num_graphs,
        )  # fmt: skip
    return result


def capture_verify_graphs(_result, model_runner, *args, **kwargs) -> None:
    """AFTER `ModelRunner.init_cuda_graphs`: with `ADASPEC_EMULATE_GRAPHS=1` on the generic CPU
    path, the target's verify graphs SGLang captures on CUDA (`DecodeCudaGraphRunner` in
    TARGET_VERIFY mode, one per captured batch size), emulated."""
    from sgl_adaspec.adapters.platform.cpu.hooks import on_generic_cpu

    if not (
        emulation_on()
        and on_generic_cpu(model_runner.device)
        and model_runner.spec_algorithm.is_speculative()
        and not model_runner.is_draft_worker
        and model_runner.decode_cuda_graph_runner is None
    ):
        return
    model_runner.decode_cuda_graph_runner = _verify_runner(model_runner)


def emulated_tier_verify_runner(worker, state):
    """A draft tier's verify graphs, which SGLang captures on CUDA with the tier's runtime state
    (`build_adaptive_runtime_state`), emulated under `ADASPEC_EMULATE_GRAPHS=1` on the generic
    CPU path; None elsewhere."""
    from sgl_adaspec.adapters.platform.cpu.hooks import on_generic_cpu

    model_runner = worker._target_worker.model_runner
    if not (emulation_on() and on_generic_cpu(model_runner.device)):
        return None
    return _verify_runner(
        model_runner, attn_backend=state.target_attn_backend,
        speculative_num_steps=state.speculative_num_steps,
        speculative_num_draft_tokens=state.speculative_num_draft_tokens,
    )  # fmt: skip


def _verify_runner(model_runner, **kwargs):
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    _share_graph_outputs(model_runner)
    if not hasattr(torch.cpu, "is_current_stream_capturing"):
        # The verify graph's callable asks it at capture and (emulated) at replay, to mark an
        # event on a CUDA stream capture; no CPU stream is ever captured.
        torch.cpu.is_current_stream_capturing = lambda: False
    with _cpu_capture_context():
        runner = DecodeCudaGraphRunner(model_runner, **kwargs)
    logger.info(
        "sgl_adaspec: emulated target verify graphs (%d tokens a request): %d captured, "
        "batch sizes %s", kwargs.get("speculative_num_draft_tokens")
        or model_runner.decode_num_tokens_per_req(), runner.backend.num_graphs, runner.capture_bs,
    )  # fmt: skip
    return runner


def target_verify_replays(original: Callable, forward_mode) -> bool:
    """AROUND `ForwardMode.is_cpu_graph`: SGLang's CPU graphs run plain decodes only; with
    `ADASPEC_EMULATE_GRAPHS=1` the emulated target verify graphs run the verify, as on CUDA."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return original(forward_mode) or (
        forward_mode == ForwardMode.TARGET_VERIFY and emulation_on()
    )
