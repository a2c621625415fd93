"""An iteration without speculation, run through SGLang 0.5.23's own steps-0 path.

Two ways, chosen per iteration by the policy (`PolicyBase.keep_draft_warm`):
- **warm**: SGLang's adaptive runtime state for steps 0 (`EAGLEWorkerV2.build_adaptive_runtime_state
  (0, 1)`, built once at start-up, on CUDA with its own graphs) is applied for the iteration and
  the configured state restored after it, as SGLang's `--speculative-adaptive` switches: a
  one-node verify of each request's bonus token, then the draft extend, which keeps the
  draft's KV cache and top-k current, so a later draft starts from the request's full context;
- **cold**: the same one-node verify with the worker's step counts set to 0 and the draft extend
  skipped (`SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND`): no draft work at all, but the next draft
  starts from a zeroed top-k (its path probabilities are 0, so nothing of it is verified) and
  the draft's KV cache lacks the skipped positions for the rest of the request. Both cost
  acceptance, not correctness: the target verifies every token.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

SWITCH_LOG = "Switch adaptive runtime state"


@dataclass(frozen=True)
class PlainStates:
    """SGLang runtime states of the worker: the configured search and steps 0."""

    configured: Any
    steps0: Any


class _QuietSwitches(logging.Filter):
    """SGLang logs every runtime-state switch at INFO; a policy may switch every iteration."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(SWITCH_LOG)


def build_plain_states(worker) -> PlainStates | None:
    """The worker's configured runtime state as it stands and a steps-0 state built by SGLang's
    own builder; None (plain iterations then run cold) where this worker cannot build one."""
    if not hasattr(worker, "build_adaptive_runtime_state") or worker.speculative_num_steps == 0:
        return None
    try:
        from sglang.srt.speculative.adaptive_runtime_state import SpecRuntimeState

        draft = worker._draft_worker
        target = worker._target_worker.model_runner
        configured = SpecRuntimeState(
            speculative_num_steps=worker.speculative_num_steps,
            speculative_num_draft_tokens=worker.speculative_num_draft_tokens,
            draft_attn_backend=draft.draft_attn_backend,
            cuda_graph_runner=draft.cuda_graph_runner,
            target_attn_backend=target.attn_backend,
            target_graph_runner=target.decode_cuda_graph_runner,
            draft_extend_attn_backend=draft.draft_extend_attn_backend,
            cuda_graph_runner_for_draft_extend=draft.cuda_graph_runner_for_draft_extend,
        )
        steps0 = worker.build_adaptive_runtime_state(0, 1)
    except Exception:  # never stop the server: plain iterations then skip the draft extend
        logger.exception("sgl_adaspec: no steps-0 runtime state; plain iterations run cold")
        return None
    logging.getLogger(type(worker).__module__).addFilter(_QuietSwitches())
    return PlainStates(configured, steps0)


@contextlib.contextmanager
def plain_decode(worker, states: PlainStates | None):
    """The worker's iteration inside runs as a plain decode: warm with `states`, cold without."""
    if states is not None:
        worker.apply_runtime_state(states.steps0)
        try:
            yield
        finally:
            worker.apply_runtime_state(states.configured)
        return
    from sglang.srt.environ import envs

    saved = (worker.speculative_num_steps, worker.speculative_num_draft_tokens)
    worker.speculative_num_steps, worker.speculative_num_draft_tokens = 0, 1
    try:
        with envs.SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND.override(True):
            yield
    finally:
        worker.speculative_num_steps, worker.speculative_num_draft_tokens = saved
