"""An iteration without speculation, run through SGLang 0.5.23's own steps-0 path.

Two ways, chosen per iteration by the policy (`PolicyBase.keep_draft_warm`):
- **warm**: the steps-0 tier (`tier_states`: SGLang's adaptive runtime state for steps 0,
  built once at start-up, on CUDA with its own graphs), as SGLang's `--speculative-adaptive`
  switches to it: a one-node verify of each request's bonus token, then the draft extend,
  which keeps the draft's KV cache current, so a later draft starts from the request's full
  context (the extend skips its lm_head where it can: the top-k is computed at the next draft,
  `deferred_topk`);
- **cold**: the same one-node verify with the worker's step counts set to 0 and the draft extend
  skipped (`SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND`): no draft work at all, but the next draft
  starts from a zeroed top-k (its path probabilities are 0, so nothing of it is verified) and
  the draft's KV cache lacks the skipped positions for the rest of the request. Both cost
  acceptance, not correctness: the target verifies every token.
"""

from __future__ import annotations

import contextlib

from sgl_adaspec.adapters.speculative.deferred_topk import DeferredTopk, extend_without_lm_head
from sgl_adaspec.adapters.speculative.tier_states import TierStates, in_tier


def warm_shape(tiers: TierStates | None):
    """The steps-0 tier of `tiers`, None where none was built (plain iterations run cold)."""
    return None if tiers is None else tiers.covering((0, 1))


@contextlib.contextmanager
def plain_decode(worker, tiers: TierStates | None, deferred: DeferredTopk):
    """The worker's iteration inside runs as a plain decode: warm in the steps-0 tier of
    `tiers`, cold without one. `deferred` follows the draft's top-k: left to the next draft by
    a warm extend without its lm_head, zeroed by a cold iteration."""
    shape = warm_shape(tiers)
    if shape is not None:
        with in_tier(worker, tiers, shape), extend_without_lm_head(worker.draft_worker, deferred):
            yield
        return
    deferred.pending = False  # SGLang zeroes the draft's state: a cold draft follows
    from sglang.srt.environ import envs

    saved = (worker.speculative_num_steps, worker.speculative_num_draft_tokens)
    worker.speculative_num_steps, worker.speculative_num_draft_tokens = 0, 1
    try:
        with envs.SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND.override(True):
            yield
    finally:
        worker.speculative_num_steps, worker.speculative_num_draft_tokens = saved


@contextlib.contextmanager
def one_node_verify(worker):
    """The verify inside, of one node per request (a plain iteration's), skips SGLang's tree
    compaction (`_finalize_accept_tree_path`, run for topk > 1): it moves each request's
    accepted path (KV slots, tokens, hidden states) to the front of its block, the identity
    for a lone root, at ~1 ms per iteration on a CPU. Not on CUDA, where a topk of 1 would
    also switch SGLang to its fused chain commit."""
    if str(worker.device).startswith("cuda"):
        yield
        return
    saved = worker.topk
    worker.topk = 1  # run_eagle_verify reads the worker's topk for this choice only
    try:
        yield
    finally:
        worker.topk = saved
