"""A prefill without the draft, where the policy finds that speculation pays at no load.

SGLang 0.5.23's EAGLE v2 runs a draft extend after every target prefill
(`EagleDraftWorker._draft_extend_for_prefill`): the draft reads the new prompts and leaves the
top-k its first beam step starts from. Where the policy stands down and keeps no draft state
(`PolicyBase.draft_prefills`), that extend is paid for nothing. It is skipped the way SGLang
skips a steps-0 draft extend (`EAGLEWorkerV2._stub_skipped_draft_extend`): the next draft input
holds the target's tokens and zeroed top-k and hidden states. The requests are then blind to
the draft for life (its KV cache lacks their prompts): their candidates read f = 0
(`draft_blind`), so the policy verifies none of their nodes. This costs acceptance, never
correctness: the target verifies every token it commits.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from sgl_adaspec.adapters.speculative.draft_tiers import needs_draft_probs
from sgl_adaspec.adapters.speculative.runtime import runtime

BLIND_ATTR = "_adaspec_draft_blind"


def draft_extend_for_prefill(
    original: Callable, draft_worker, batch, target_hidden_states, next_token_ids, *args, **kwargs
):
    """AROUND `EagleDraftWorker._draft_extend_for_prefill`: skipped where the policy asks
    (rank 0 decides for its TP group). Prefills whose verify reads the draft's distribution
    (rejection sampling) always run it."""
    state = runtime()
    driver = state.driver if state is not None else None
    if driver is None or batch.forward_mode.is_idle() or needs_draft_probs(batch.sampling_info):
        return original(draft_worker, batch, target_hidden_states, next_token_ids, *args, **kwargs)
    sync = state.tp_sync
    skip = not driver.draft_prefills(len(batch.reqs)) if sync.leads else None
    blind = sync.value(skip)
    if not blind:
        return original(draft_worker, batch, target_hidden_states, next_token_ids, *args, **kwargs)
    for req in batch.reqs:
        setattr(req, BLIND_ATTR, True)
    if sync.leads:
        driver.policy.stats.blind_prefills += len(batch.reqs)
    return _stub_draft_input(draft_worker, len(batch.reqs), next_token_ids)


def _stub_draft_input(draft_worker, batch_size: int, next_token_ids: torch.Tensor):
    """The next draft input of a skipped extend, shaped as SGLang's own stub."""
    from sglang.srt.speculative.eagle_info import EagleDraftInput
    from sglang.srt.speculative.eagle_utils import get_draft_recurrent_hidden_state_spec

    device, topk = next_token_ids.device, draft_worker.topk
    hidden_size, hidden_dtype = get_draft_recurrent_hidden_state_spec(draft_worker.draft_runner)
    hidden = None
    if hidden_size is not None:
        hidden = torch.zeros((batch_size, hidden_size), dtype=hidden_dtype, device=device)
    return EagleDraftInput(
        topk_p=torch.zeros((batch_size, topk), dtype=torch.float32, device=device),
        topk_index=torch.zeros((batch_size, topk), dtype=torch.int64, device=device),
        hidden_states=hidden,
        bonus_tokens=next_token_ids,
        num_tokens_per_req=1,
        num_tokens_for_logprob_per_req=1,
    )


def draft_blind(reqs) -> torch.Tensor:
    """[B] bool: the requests prefilled without the draft."""
    return torch.tensor([getattr(req, BLIND_ATTR, False) for req in reqs], dtype=torch.bool)
