"""SGLang adapter of the speculation policies: hooks around EAGLE v2's draft and verify.

One speculative decode iteration of `EAGLEWorkerV2.forward_batch_generation`:
1. the draft's beam search and SGLang's per-request rerank (`organize_draft_results`) produce
   each request's candidate tree; the hook keeps the candidates' path probabilities f;
2. before verification (`EAGLEWorkerV2.verify`) the policy selects, per request, which
   candidates to verify; unselected nodes are cut out of the tree links, so the greedy or
   sampling walk can only accept selected nodes;
3. the target's verify forward (`TpModelWorker.forward_batch_generation`, is_verify) runs on the
   selected nodes only (ragged: each request its own count) where the attention backend supports
   it (the plugin's torch backend), and its outputs are scattered back to SGLang's [bs, ntok]
   layout; elsewhere the full tree is verified and only acceptance is restricted;
4. the iteration's wall time updates the policy's latency estimate.
Per-request verified-token counts go to each response's meta_info (`adaspec_verified_tokens`,
token-aligned: `request_state.record_verified`) through SGLang's `customized_info`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from functools import partial

import torch

from sgl_adaspec.adapters import fleet_view
from sgl_adaspec.adapters.platform.cpu.ragged_verify import ragged_verify
from sgl_adaspec.adapters.speculative import request_state
from sgl_adaspec.adapters.speculative.blind_prefill import draft_blind
from sgl_adaspec.adapters.speculative.deferred_topk import fill_topk
from sgl_adaspec.adapters.speculative.draft_outputs import (
    DraftOutputs,
    collect_path_prob,
    hand_path_prob,
)
from sgl_adaspec.adapters.speculative.draft_tiers import needs_draft_probs, run_draft
from sgl_adaspec.adapters.speculative.early_exit import exit_run, plan_exit_run
from sgl_adaspec.adapters.speculative.fallbacks import Fallback, fell_back, strict
from sgl_adaspec.adapters.speculative.host_read_count import counted_host_reads
from sgl_adaspec.adapters.speculative.iteration import (
    Iteration,
    Verifying,
    current_iteration,
    iteration_scope,
)
from sgl_adaspec.adapters.speculative.plain_decode import one_node_verify, plain_decode, warm_shape
from sgl_adaspec.adapters.speculative.runtime import (
    current_policy,
    runtime,
    warn_once,
)
from sgl_adaspec.adapters.speculative.tier_states import TierStates, extend_width, in_tier
from sgl_adaspec.adapters.speculative.tree import (
    DraftTree,
    candidates_from_verify_input,
    deepest_accepted,
    draft_tree,
    prune_tree,
    scatter_rows,
    verify_tree_parents,
)
from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.driver import DraftPlan, IterationDriver, VerifyResult
from sgl_adaspec.speculative.host_copy import to_host
from sgl_adaspec.speculative.host_reads import unmarked
from sgl_adaspec.speculative.policies.base import (
    IterationInput,
    Outcome,
    PolicyBase,
    policy_calls,
)

logger = logging.getLogger(__name__)


def forward_batch_generation(original: Callable, worker, batch, *args, **kwargs):
    """AROUND `EAGLEWorkerV2.forward_batch_generation`: one iteration scope, timed, planned and
    observed once through the runtime's `IterationDriver`. A draft depth of 0 runs the
    iteration as a plain decode through SGLang's own steps-0 path (`plain_decode`), warm or
    cold as the policy asks."""
    state = runtime()
    driver = state.driver if state is not None else None
    if driver is None:
        return original(worker, batch, *args, **kwargs)
    clock = state.clock
    if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
        clock.interrupt()
        return original(worker, batch, *args, **kwargs)
    if batch.forward_mode.is_idle():
        clock.last_decode_end_s = None
        with iteration_scope():
            return original(worker, batch, *args, **kwargs)
    configured = (worker.speculative_num_steps, worker.topk)
    after_prefill = clock.last_decode_end_s is None
    forward_start = clock.now()
    start = clock.cycle_start(forward_start)
    stall_ms = clock.stall_ms(frozenset(req.rid for req in batch.reqs), forward_start)
    with iteration_scope() as scope:
        plan = scope.plan = _plan(driver, state, batch, configured)
        if plan.plain:
            with plain_decode(worker, state.tiers if plan.keep_warm else None, state.deferred_topk):
                verify_start = clock.now()
                result = original(worker, batch, *args, **kwargs)
                scope.verified.ms = 1000 * (clock.now() - verify_start)
                scope.verified.accepted = result.accept_lens
        else:
            tier = contextlib.nullcontext()
            if (plan.depth, plan.width) != configured:
                tier = in_tier(worker, state.tiers, (plan.depth, plan.width), batch.spec_info)
            with tier:
                result = original(worker, batch, *args, **kwargs)
    end = clock.now()
    clock.last_decode_end_s = end
    if not state.tp_sync.leads:
        return result  # rank 0 observes for the group
    policy, verifying = driver.policy, scope.verifying
    if not plan.plain:
        rows = (plan.depth - 1) * len(batch.reqs) * plan.width
        policy.stats.observe_draft(
            plan.depth, plan.width, rows, replayed=not scope.draft.ran_eagerly,
            decided=verifying is not None and verifying.decision is not None,
            ragged=scope.verified.ragged, extend_replayed=scope.draft.extend_replayed,
            verify_replayed=scope.verified.replayed,
        )  # fmt: skip
    if scope.verified.ms is None:  # the policy fell back: nothing observed, read it now
        request_state.record_committed(batch.reqs, result.accept_lens)
    else:
        iteration_ms = 1000 * (end - start)
        ended = _verify_result(batch, scope, iteration_ms, after_prefill, stall_ms)
        decided = (verifying.policy_input, verifying.decision) if verifying else (None, None)
        try:
            outcomes = driver.observe(plan, ended, *decided)
        except Exception as exc:  # the policy must never take the server down
            fell_back(Fallback.OBSERVE, exc)
            outcomes = []
        for outcome in outcomes:
            if state.decision_log is not None:
                state.decision_log.write(outcome, policy.account())
    fleet_view.publish(policy, end)
    return result


def _plan(driver: IterationDriver, state, batch, configured: tuple[int, int]) -> DraftPlan:
    """The draft this iteration runs, as every TP rank gets it: rank 0's plan, in the built
    tier that covers it (the configured search without tiers), warm only where the steps-0
    tier was built (`plain_decode`); the configured search if the policy raised."""
    sync, tiers = state.tp_sync, state.tiers
    slo = shape = None
    if sync.leads:
        policy = driver.policy
        try:
            # slo_batch attaches the SLO clock of requests decoding for the first time.
            with policy_calls():
                slo = request_state.slo_batch(batch.reqs, policy, policy.baseline_tpot_ms())
            # Only where the steps-0 tier was built can a plain iteration keep the draft warm.
            plan = driver.plan(
                len(batch.reqs), configured, slo, warm_shape(tiers) is not None,
                runs_in=lambda asked: _tier_of(tiers, asked, batch) or configured,
            )  # fmt: skip
        except Exception as exc:  # the policy must never take the server down
            fell_back(Fallback.PLAN, exc)
            plan = DraftPlan(*configured, slo=slo)
        shape = (plan.depth, plan.width, plan.keep_warm)
    depth, width, warm = sync.value(shape)
    return DraftPlan(depth, width, warm, slo)


def _tier_of(tiers: TierStates | None, shape: tuple[int, int], batch) -> tuple[int, int] | None:
    """The built tier an iteration asking the draft for `shape` runs in; None (the configured
    search) without tiers and for drafts whose distribution the verify reads."""
    if tiers is None or needs_draft_probs(batch.sampling_info):
        return None
    return tiers.covering(shape)


def _verify_result(
    batch, scope: Iteration, iteration_ms: float, after_prefill: bool, stall_ms: float
) -> VerifyResult:
    reqs, verified = batch.reqs, scope.verified
    return VerifyResult(
        accept_lens=verified.accepted,
        on_taken=partial(_requests_took, reqs),
        verify_ms=verified.ms,
        iteration_ms=iteration_ms,
        rids=tuple(req.rid for req in reqs),
        context_tokens=sum(len(req.origin_input_ids) + len(req.output_ids) for req in reqs),
        deepest_accepted=verified.deepest_accepted,
        early_exit=verified.early_exit_counts,
        after_prefill=after_prefill,
        stall_ms=stall_ms,
        verify_as_decode=scope.verified.as_decode,
    )


def _requests_took(reqs, outcome: Outcome) -> None:
    """The iteration's tokens on its requests' SLO clocks and responses, from its outcome on
    the host: no read of the device's results as the iteration ends."""
    request_state.record_committed(reqs, outcome.accepted if outcome.speculated else 1)
    if outcome.speculated:
        request_state.record_verified(reqs, outcome.verified, outcome.accepted)


def draft(original: Callable, draft_worker, batch, *args, **kwargs):
    """AROUND `EagleDraftWorker.draft`: a top-k that the last warm plain iteration left to the
    next draft is computed first (`deferred_topk`)."""
    state = runtime()
    deferred = state.deferred_topk if state is not None else None
    if deferred is not None and deferred.pending and not batch.forward_mode.is_idle():
        fill_topk(draft_worker, batch)
        deferred.pending = False
        if (policy := current_policy()) is not None:
            policy.stats.deferred_topk_drafts += 1
    return original(draft_worker, batch, *args, **kwargs)


def draft_forward(original: Callable, draft_worker, forward_batch) -> DraftOutputs:
    """AROUND `EagleDraftWorker.draft_forward`, the callable SGLang captures as the draft's
    graph: the beam search of the iteration's tier, whose outputs carry the kept nodes' path
    probabilities (`DraftOutputs`). Only an eager call inside an iteration hands them to the
    iteration (never true in a captured region); a replay's reach it by `replayed_draft`."""
    state = runtime()
    tiers = state.tiers if state is not None else None
    in_a_tier = tiers is not None and (
        (draft_worker.speculative_num_steps, draft_worker.topk) != tiers.configured
    )
    with collect_path_prob() as collected:
        out = run_draft(original, draft_worker, forward_batch, in_a_tier)
    outputs = DraftOutputs(out, collected.path_prob)
    scope = current_iteration()
    if scope is not None:
        scope.draft.ran_eagerly = True
        scope.draft.path_prob = outputs.path_prob
    return outputs


def replayed_draft(original: Callable, runner, shape_key, forward_batch):
    """AROUND `EAGLEDraftCudaGraphRunner._replay_graph`, right after a draft graph's replay:
    the path probabilities its replay wrote (the capture-time `DraftOutputs.path_prob`) go to
    the iteration, copied out before any other graph of the shared pool runs."""
    out = original(runner, shape_key, forward_batch)
    scope = current_iteration()
    path_prob = getattr(out, "path_prob", None)
    if scope is not None and path_prob is not None:
        scope.draft.path_prob = path_prob[: runner.raw_bs].clone()
    return out


def draft_extend_for_decode(original: Callable, draft_worker, *args, **kwargs):
    """AROUND `EagleDraftWorker._draft_extend_for_decode`: a tier's draft extend keeps the
    configured width, so the next iteration may draft in any tier (`tier_states`)."""
    tiers = runtime().tiers if runtime() is not None else None
    if tiers is None or draft_worker.topk == tiers.configured[1]:
        return original(draft_worker, *args, **kwargs)
    with extend_width(draft_worker, tiers.configured[1]):
        return original(draft_worker, *args, **kwargs)


def replayed_draft_extend(original: Callable, runner, shape_key, forward_batch):
    """AROUND `EAGLEDraftExtendCudaGraphRunner._replay_graph`: the iteration's draft extend ran
    as a graph replay (counted; the plugin reads nothing of its outputs)."""
    out = original(runner, shape_key, forward_batch)
    scope = current_iteration()
    if scope is not None:
        scope.draft.extend_replayed = True
    return out


def organize_draft_results(original: Callable, score_list, token_list, parents_list, num_draft):
    """AROUND `eagle_utils.organize_draft_results` (inside the draft's captured region): the
    chosen nodes' path probabilities, as tensor work, to the enclosing `draft_forward`."""
    parent_list, top_scores_index, draft_tokens = original(
        score_list, token_list, parents_list, num_draft
    )
    scores = torch.cat(score_list, dim=1).flatten(1)  # [bs, all expanded nodes]
    hand_path_prob(torch.gather(scores, 1, top_scores_index))  # [bs, num_draft - 1]
    return parent_list, top_scores_index, draft_tokens


def verify(original: Callable, worker, batch, *args, **kwargs):
    """AROUND `EAGLEWorkerV2.verify`: decide, prune the tree, verify; the outcome goes to the
    iteration scope (observed once by `forward_batch_generation`)."""
    state = runtime()
    driver = state.driver if state is not None else None
    scope = current_iteration()
    if scope is not None and scope.plain and batch.spec_info.draft_token_num == 1:
        with one_node_verify(worker):
            return original(worker, batch, *args, **kwargs)
    if (
        driver is None
        or scope is None
        or scope.plain
        or scope.draft.path_prob is None
        or batch.forward_mode.is_idle()
    ):
        return original(worker, batch, *args, **kwargs)
    verify_input = batch.spec_info
    with counted_host_reads() as reads:
        tree = draft_tree(verify_input, scope.draft.path_prob, marked=reads is not None)
        # The draft tree's parent links, walked once: the candidates, the pruning and the early
        # exit all read them (pruning only unlinks nodes, so kept nodes keep these parents).
        parents = verify_tree_parents(tree)
        sync = state.tp_sync
        shape = (len(batch.reqs), verify_input.draft_token_num)
        it = decision = keep = None
        if sync.leads:
            it, decision = _decide(batch, driver, scope.plan, tree, parents)
            keep = torch.ones(shape, dtype=torch.bool, device=tree.path_prob.device)
            if decision is not None:
                keep[:, 1:] = decision.selection.mask
        keep = sync.mask(keep, shape, tree.path_prob.device)
        if decision is not None or not sync.leads:
            prune_tree(tree, keep, parents)
    if reads is not None:
        driver.policy.stats.observe_host_reads(reads.count, reads.sites)
        # The marks stay in the window: what SGLang's verify receives is plain.
        keep, parents = unmarked(keep), unmarked(parents)
    if decision is None and sync.leads:  # the full tree, as every rank got it
        return original(worker, batch, *args, **kwargs)
    scope.verifying = Verifying(parents, it, decision, keep)
    verified, clock = scope.verified, state.clock
    start = clock.now()
    result = original(worker, batch, *args, **kwargs)
    verified.ms = 1000 * (clock.now() - start)
    if decision is None:
        return result  # a follower: rank 0 observes for the group
    verified.accepted = result.accept_lens
    ids, lens = result.next_token_ids, result.accept_lens
    if ids is not None and lens is not None:
        # Walked on the host once the copies landed, over the candidates the driver copied.
        verified.deepest_accepted = partial(
            deepest_accepted, verified=to_host(decision.selection.mask),
            committed_ids=to_host(ids), accept_lens=to_host(lens),
            ntok=verify_input.draft_token_num,
        )  # fmt: skip
    return result


def _decide(batch, driver: IterationDriver, plan: DraftPlan, tree: DraftTree, parents):
    """The policy's input and decision, or (None, None) if the policy raised: the full tree is
    then verified, because the policy must never take the server down."""
    try:
        it = iteration_input(batch, driver.policy, plan, tree, parents)
        decision = driver.decide(it)
        for req, hopeless in zip(batch.reqs, decision.infeasible.tolist()):
            req._adaspec_state.infeasible |= hopeless
    except Exception as exc:
        fell_back(Fallback.DECISION, exc)
        return None, None
    return it, decision


def _check_depths(cands: Candidates) -> None:
    """Under the strict switch (the tests): the depths read from SGLang's positions are those
    its parent links give (a walk; host reads of unmarked copies, not counted)."""
    plain = Candidates.trusted(*(unmarked(t) for t in (cands.tokens, cands.parents,
                                                       cands.path_prob, cands.valid)))  # fmt: skip
    if not torch.equal(unmarked(cands.depth), plain.depth):
        raise RuntimeError("sgl_adaspec: SGLang's positions disagree with its tree's links")


def iteration_input(
    batch, policy: PolicyBase, plan: DraftPlan, tree: DraftTree, parents: torch.Tensor
) -> IterationInput:
    """What the policy sees of this iteration (see `IterationInput`): the candidates of the
    draft `plan` ran (parents [bs, ntok]: its tree's links), and the SLO state it was planned
    for."""
    reqs = batch.reqs
    cands = candidates_from_verify_input(tree, parents)
    if strict():
        _check_depths(cands)
    blind = draft_blind(reqs)  # [B] bool, host
    if bool(blind.any()):  # the draft never read their prompts: nothing of theirs pays
        blind = blind.to(cands.path_prob.device, non_blocking=True).unsqueeze(1)
        cands = cands.with_path_prob(cands.path_prob.masked_fill(blind, 0.0))
    return IterationInput(
        cands=cands,
        slo=plan.slo,
        rids=tuple(req.rid for req in reqs),
        context_tokens=sum(len(req.origin_input_ids) + len(req.output_ids) for req in reqs),
        draft_depth=plan.depth,
        draft_width=plan.width,
        history=(
            tuple(list(req.origin_input_ids) + list(req.output_ids) for req in reqs)
            if policy.needs_history
            else None
        ),
    )


def target_forward(original: Callable, worker, batch=None, forward_batch=None, *args, **kwargs):
    """AROUND `TpModelWorker.forward_batch_generation`: ragged verify of the kept nodes, with
    the policy's early exit (`sglang.early_exit`) where it asked for one and the model
    supports it."""
    scope = current_iteration()
    if scope is None or not kwargs.get("is_verify", False):
        return original(worker, batch, forward_batch, *args, **kwargs)
    spec_info = forward_batch.spec_info
    replayed = _replays_verify_graph(worker, forward_batch)
    torch_backend = _backend_runs_ragged_verify(worker)
    # One node per request on the torch attention: its one-token path, a plain decode's forward.
    scope.verified.as_decode = torch_backend and not replayed and spec_info.draft_token_num == 1
    verifying = scope.verifying
    if verifying is None:
        return original(worker, batch, forward_batch, *args, **kwargs)
    if replayed:
        # A graph verifies the captured [bs, ntok] shape: the pruned tree restricts acceptance.
        scope.verified.replayed = True
        return original(worker, batch, forward_batch, *args, **kwargs)
    if not torch_backend:
        warn_once(
            "sgl_adaspec: ragged verify (the selected nodes only) runs on the plugin's torch "
            f"attention backend; {type(worker.model_runner.attn_backend).__name__} verifies "
            "the tier's whole tree and the selection restricts acceptance"
        )
        decision = verifying.decision
        if decision is not None and decision.early_exit is not None:
            warn_once(
                "sgl_adaspec: faser early exit runs on the plugin's torch attention backend "
                "(the CPU recipe) only; verifying in full"
            )
        return original(worker, batch, forward_batch, *args, **kwargs)
    run = plan_exit_run(worker, forward_batch, verifying)
    keep = verifying.keep
    if run is None and bool(keep.all()):
        return original(worker, batch, forward_batch, *args, **kwargs)
    rows = keep.reshape(-1).nonzero().squeeze(1)  # [kept] rows of the [bs * ntok] layout
    full = {
        name: getattr(forward_batch, name) for name in ("input_ids", "positions", "out_cache_loc")
    }
    for name, value in full.items():
        setattr(forward_batch, name, value[rows])
    scope.verified.ragged = True
    scope.verified.as_decode = False
    try:
        with exit_run(run), ragged_verify(forward_batch, [row.nonzero().squeeze(1) for row in keep]):
            result = original(worker, batch, forward_batch, *args, **kwargs)
    finally:
        for name, value in full.items():
            setattr(forward_batch, name, value)
    if run is not None and run.exited is not None:
        scope.verified.early_exit_counts = (run.tested, int(run.exited.sum()), run.test_ms)
        if bool(run.exited.any()):
            # Exited nodes leave the tree: acceptance stops at their parents (lossless).
            rows = rows[~run.exited]
            keep = torch.zeros_like(keep).view(-1).index_fill_(0, rows, True).view(keep.shape)
            prune_tree(draft_tree(spec_info, scope.draft.path_prob), keep, verifying.parents)
    scatter_rows(result.logits_output, rows, keep.numel())
    return result


def _replays_verify_graph(worker, forward_batch) -> bool:
    """Whether SGLang runs this verify as a replay of its target verify graph."""
    runner = worker.model_runner.decode_cuda_graph_runner
    return runner is not None and bool(runner.can_run_graph(forward_batch))


def _backend_runs_ragged_verify(worker) -> bool:
    from sgl_adaspec.adapters.platform.cpu.attention import TorchTreeAttnBackend

    return isinstance(worker.model_runner.attn_backend, TorchTreeAttnBackend)
