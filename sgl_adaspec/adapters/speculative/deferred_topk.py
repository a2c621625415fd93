"""A warm plain iteration's draft extend without its lm_head.

The draft extend of a warm plain iteration (`plain_decode`) keeps the draft's KV cache current
and computes the draft's top-k for the next draft. Only a draft reads that top-k, and a plain
iteration is mostly followed by another one, whose extend overwrites it. So the extend runs
without the lm_head: its logits are a placeholder, and the real top-k is computed once, from the
hidden state the extend kept, just before the next draft (`fill_topk`), as SGLang's extend
would have computed it.

Why: on a small model the draft's lm_head (shared with the target) is most of the draft's
weights: with it a warm plain iteration costs ~1.3x a plain decode, without it ~1x.

Deferred only where the shortcut is exact: an eager extend (a graph replay computes the top-k
anyway), an EAGLE draft whose logits are its lm_head over the hidden state it keeps
(`LlamaForCausalLMEagle`), no hot-token map, top-k > 1, no rejection sampling (its draft
probabilities span the vocabulary), no DP attention (its logits gather needs the forward's
metadata). Elsewhere the extend runs whole.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

# Drafts whose logits are lm_head(the hidden state passed to the next draft step): no final
# norm between the two.
DEFERRABLE_DRAFTS = ("LlamaForCausalLMEagle",)


@dataclass
class DeferredTopk:
    """Whether the running batch's draft top-k is a placeholder, to be computed before its next
    draft."""

    pending: bool = False


def can_defer(draft_worker) -> bool:
    from sglang.srt.runtime_context import get_spec

    model = draft_worker.draft_runner.model
    return (
        # A graph replay runs the extend it captured, lm_head included: no Python of ours there.
        draft_worker.cuda_graph_runner_for_draft_extend is None
        and type(model).__name__ in DEFERRABLE_DRAFTS
        and draft_worker.topk > 1
        and getattr(draft_worker, "hot_token_id", None) is None
        and not get_spec().speculative_use_rejection_sampling
        and not model.logits_processor.do_tensor_parallel_all_gather_dp_attn
    )


@contextlib.contextmanager
def extend_without_lm_head(draft_worker, deferred: DeferredTopk):
    """The draft extend inside skips the draft's lm_head where `can_defer`; `deferred.pending`
    is set once it did (an extend replayed from a graph never calls it)."""
    if not can_defer(draft_worker):
        yield
        return
    processor = draft_worker.draft_runner.model.logits_processor
    width = draft_worker.topk

    def placeholder_logits(hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        deferred.pending = True
        return hidden_states.new_zeros(hidden_states.shape[0], width, dtype=torch.float32)

    processor._get_logits = placeholder_logits  # an instance attribute shadows the method
    try:
        yield
    finally:
        del processor._get_logits


def fill_topk(draft_worker, batch) -> None:
    """The draft top-k of `batch`'s running requests, from the hidden state the last extend kept:
    the draft's logits, then SGLang's own renorm and top-k, as `_draft_extend_for_decode`
    computes them. Rows a prefill added since already hold theirs; recomputing them gives the
    same values."""
    from sglang.srt.layers.logits_processor import LogitsMetadata
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.spec_utils import renorm_draft_probs
    from sglang.srt.utils.common import fast_topk

    draft_input = batch.spec_info
    model = draft_worker.draft_runner.model
    logits = model.logits_processor._get_logits(
        draft_input.hidden_states,
        model.lm_head,
        LogitsMetadata(forward_mode=ForwardMode.DECODE),
        use_logits_buffer=False,
    )
    probs = renorm_draft_probs(logits, batch.sampling_info, False)
    draft_input.topk_p, draft_input.topk_index = fast_topk(probs, draft_worker.topk, dim=-1)
