"""SGLang adapter of draft tiers: run the draft's beam search at the policy's (depth, width).

AROUND `EagleDraftWorker.draft_forward`. The policy picks the iteration's draft shape (d', w')
before the draft runs (`PolicyBase.draft_shape`, stored in the iteration scope by
`hooks.forward_batch_generation`). When it is smaller than the configured (d, w) this hook
runs d' - 1 draft forwards over B * w' rows, the first w' branches of SGLang's draft KV slots,
and hands `organize_draft_results` the result in the (d, w) layout (`draft_tiers.embed_beam`),
so the verify tree, its buffers and the next draft extend keep their configured sizes.

Where it runs: eagerly with the plugin's torch draft attention (`--attention-backend
torch_native`, any device). Elsewhere (SGLang's CUDA backends and their captured graphs, which
are built for one (d, w)) and for drafts that carry draft probabilities (rejection sampling),
the configured search runs and the policy only narrows what is verified.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sgl_adaspec.speculative.draft_tiers import beam_step, embed_beam

logger = logging.getLogger(__name__)


def runs_tiers(draft_worker, forward_batch) -> bool:
    """Whether this draft can run at a smaller shape than configured (see module docstring)."""
    from sglang.srt.runtime_context import get_spec

    from sgl_adaspec.platform.cpu.attention import TorchMultiStepDraftBackend

    needs_draft_probs = (
        get_spec().speculative_use_rejection_sampling
        and not forward_batch.sampling_info.is_all_greedy
    )
    return (
        isinstance(draft_worker.draft_attn_backend, TorchMultiStepDraftBackend)
        and not forward_batch.forward_mode.is_idle()
        and not needs_draft_probs
        and draft_worker.topk >= 2
    )


def _tier_backend(draft_worker, width: int):
    """The draft attention for a beam of `width` over the configured slot layout (cached)."""
    from sgl_adaspec.platform.cpu.attention import TorchMultiStepDraftBackend

    cache = draft_worker.__dict__.setdefault("_adaspec_tier_backends", {})
    if width not in cache:
        cache[width] = TorchMultiStepDraftBackend(
            draft_worker.draft_runner, width, draft_worker.speculative_num_steps
        )
    return cache[width]


def run_draft(original: Callable, draft_worker, forward_batch, shape: tuple[int, int] | None):
    """`draft_forward` at `shape` = (depth, width), or the configured search when the shape is
    None (the caller passes None where `runs_tiers` is False) or not smaller. Returns what
    `draft_forward` returns."""
    steps, topk = draft_worker.speculative_num_steps, draft_worker.topk
    if shape is None or shape == (steps, topk):
        return original(draft_worker, forward_batch)
    depth, width = shape
    if not (1 <= depth <= steps and 1 <= width <= topk):
        raise ValueError(f"draft shape {shape} outside the configured ({steps}, {topk})")
    return _beam_search(draft_worker, forward_batch, depth, width)


def _beam_search(draft_worker, forward_batch, depth: int, width: int):
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
    from sglang.srt.speculative import eagle_worker_v2 as sgl
    from sglang.srt.speculative.eagle_utils import per_step_draft_out_cache_loc
    from sglang.srt.speculative.spec_utils import renorm_draft_probs
    from sglang.srt.utils.common import fast_topk

    spec_info = forward_batch.spec_info
    steps, topk = draft_worker.speculative_num_steps, draft_worker.topk
    bsz = forward_batch.batch_size
    # SGLang's draft slots: [steps, bs * topk] -> this tier writes branches 0..width-1.
    slots = per_step_draft_out_cache_loc(forward_batch.out_cache_loc, bsz, topk, steps)
    slots = slots.view(steps, bsz, topk)[:, :, :width]
    # The draft extend's top-k is sorted: the tier's first beams are its `width` best.
    topk_p, topk_index = spec_info.topk_p[:, :width], spec_info.topk_index[:, :width]
    hot = draft_worker.hot_token_id
    if hot is not None:
        topk_index = hot[topk_index]
    hidden = spec_info.hidden_states
    forward_batch.positions = forward_batch.seq_lens.repeat_interleave(width).to(
        forward_batch.positions.dtype
    )
    backend = _tier_backend(draft_worker, width)
    backend.init_forward_metadata(forward_batch)
    scores, lists = None, ([], [], [])
    for i in range(depth):
        input_ids, hidden, scores, tree_info = beam_step(
            i, topk_p, topk_index, hidden, scores, width
        )
        for out, value in zip(lists, tree_info):
            out.append(value)
        if i == depth - 1:
            break
        forward_batch.input_ids = input_ids
        forward_batch.out_cache_loc = slots[i].reshape(-1)
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
    score_list, token_list, parents_list = embed_beam(*lists, width=topk, steps=steps)
    # Looked up on SGLang's module so the plugin's hook on it (path probabilities) applies.
    parent_list, top_scores_index, draft_tokens = sgl.organize_draft_results(
        score_list, token_list, parents_list, draft_worker.speculative_num_draft_tokens
    )
    return parent_list, top_scores_index, draft_tokens, None
