"""SGLang adapter of the draft tiers' beam search: AROUND `EagleDraftWorker.draft_forward`.

The iteration runs inside its tier (`tier_states.in_tier`: the worker's steps, width, draft
tokens and backends are the tier's), so the draft's layout is the tier's own. Which beam search
runs there:
- the plugin's eager one (`eager_beam`) on the plugin's torch draft attention, where SGLang's
  beam step (`select_top_k_tokens`, torch.compile'd) would compile once per tier width while
  serving, and for chain and depth-1 tiers on any device (SGLang's topk-1 path keeps no path
  probabilities; a depth-1 tier has no draft forward at all);
- SGLang's own everywhere else (on CUDA from the tier's captured graph when it can run: then
  `draft_forward` is not even called).
Drafts that carry draft probabilities (rejection sampling) always run the configured search.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sgl_adaspec.speculative.draft_tiers import beam_step

logger = logging.getLogger(__name__)


def needs_draft_probs(sampling_info) -> bool:
    """Whether the verify reads the draft's distribution (rejection sampling): tiers then off."""
    from sglang.srt.runtime_context import get_spec

    return get_spec().speculative_use_rejection_sampling and not sampling_info.is_all_greedy


def runs_eager(draft_worker, forward_batch) -> bool:
    """Whether this draft runs the plugin's eager beam search (see the module docstring)."""
    from sgl_adaspec.adapters.platform.cpu.attention import TorchMultiStepDraftBackend

    return (
        not forward_batch.forward_mode.is_idle()
        and not needs_draft_probs(forward_batch.sampling_info)
        and (
            isinstance(draft_worker.draft_attn_backend, TorchMultiStepDraftBackend)
            or draft_worker.speculative_num_steps == 1
            or draft_worker.topk == 1
        )
    )


def run_draft(original: Callable, draft_worker, forward_batch, in_tier: bool):
    """`draft_forward` of the worker's current shape: the eager beam search inside a tier where
    `runs_eager`, SGLang's otherwise. Returns what `draft_forward` returns."""
    if in_tier and runs_eager(draft_worker, forward_batch):
        return eager_beam(draft_worker, forward_batch)
    return original(draft_worker, forward_batch)


def eager_beam(draft_worker, forward_batch):
    """SGLang's `draft_forward` (greedy-verified drafts) with the eager beam step."""
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
    from sglang.srt.speculative import eagle_worker_v2 as sgl
    from sglang.srt.speculative.eagle_utils import per_step_draft_out_cache_loc
    from sglang.srt.speculative.spec_utils import renorm_draft_probs
    from sglang.srt.utils.common import fast_topk

    spec_info = forward_batch.spec_info
    steps, width = draft_worker.speculative_num_steps, draft_worker.topk
    slots = per_step_draft_out_cache_loc(
        forward_batch.out_cache_loc, forward_batch.batch_size, width, steps
    )
    topk_p, topk_index = spec_info.topk_p, spec_info.topk_index
    hot = draft_worker.hot_token_id
    if hot is not None:
        topk_index = hot[topk_index]
    hidden = spec_info.hidden_states
    backend = draft_worker.draft_attn_backend  # the tier's; `draft` prepared its metadata
    scores, lists = None, ([], [], [])
    for i in range(steps):
        input_ids, hidden, scores, tree_info = beam_step(
            i, topk_p, topk_index, hidden, scores, width
        )
        for out, value in zip(lists, tree_info):
            out.append(value)
        if i == steps - 1:
            break
        forward_batch.input_ids = input_ids
        forward_batch.out_cache_loc = slots[i]
        spec_info.hidden_states = hidden
        with forward_context(
            ForwardContext(attn_backend=backend.attn_backends[i]), forward_batch=forward_batch
        ):
            logits_output = draft_worker.draft_runner.forward(forward_batch).logits_output
        probs = renorm_draft_probs(
            logits_output.next_token_logits, forward_batch.sampling_info, False
        )
        topk_p, topk_index = fast_topk(probs, width, dim=-1)
        forward_batch.positions.add_(1)
        if hot is not None:
            topk_index = hot[topk_index]
        hidden = logits_output.hidden_states
    # Looked up on SGLang's module so the plugin's hook on it (path probabilities) applies.
    parent_list, top_scores_index, draft_tokens = sgl.organize_draft_results(
        *lists, draft_worker.speculative_num_draft_tokens
    )
    return parent_list, top_scores_index, draft_tokens, None
