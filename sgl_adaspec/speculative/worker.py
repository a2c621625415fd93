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
one entry per iteration) through SGLang's `customized_info`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from sgl_adaspec.config import AdaspecConfig
from sgl_adaspec.platform.cpu.ops import NO_NODE, sibling_links, tree_parent_nodes
from sgl_adaspec.scheduler.cost_model import VerifyCostProfile, knee_budget
from sgl_adaspec.scheduler.request_slo import RequestSlo
from sgl_adaspec.scheduler.sglang_adapter import request_slo
from sgl_adaspec.scheduler.slo import SloBatch
from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.metrics import PrometheusSink, metrics_enabled
from sgl_adaspec.speculative.policies import build_policy
from sgl_adaspec.speculative.policies.base import (
    Decision,
    IterationInput,
    Outcome,
    PolicyBase,
    make_outcome,
)
from sgl_adaspec.speculative.iteration import Iteration, _ITERATION, iteration_scope
from sgl_adaspec.speculative.tiered_draft import run_draft, runs_tiers
from sgl_adaspec.speculative.verify_exit import (
    ExitRun,
    exit_run,
    llama_model_forward,
    llama_stack,
    should_test,
)

logger = logging.getLogger(__name__)

VERIFIED_TOKENS_KEY = "adaspec_verified_tokens"


@dataclass
class RequestState:
    """Per-request SLO bookkeeping, attached to SGLang's Req (it lives as long as the request).
    `policy` is the process's policy: the request reports itself to its statistics when it
    finishes, and the policy forgets its per-request state."""

    slo: RequestSlo
    decode_start_s: float
    tokens_at_start: int
    policy: PolicyBase
    reported: bool = False
    # Set once its SLO was found unreachable even alone; it is then served best effort.
    infeasible: bool = False

    @property
    def stats(self):
        return self.policy.stats

    def tpot_ms(self, tokens_out: int, now_s: float) -> float | None:
        decoded = tokens_out - self.tokens_at_start
        return 1000 * (now_s - self.decode_start_s) / decoded if decoded > 0 else None


@dataclass
class LoopClock:
    """When the last decode iteration of this scheduler ended (None: the last forward was not
    a decode iteration). An iteration's cost includes the scheduler's work between it and the
    previous one (processing that result, preparing this batch): per token it is a large
    share of a small model's plain decode, and a policy weighing plain against speculative
    iterations must see it."""

    last_decode_end_s: float | None = None

    def cycle_start(self, forward_start_s: float) -> float:
        """Where the iteration starting its forward at `forward_start_s` began."""
        last = self.last_decode_end_s
        return forward_start_s if last is None else min(last, forward_start_s)


@dataclass(frozen=True)
class Runtime:
    """The plugin's state in one scheduler process, built once when the scheduler starts
    (`scheduler_started`): the parsed flags, the policy (None for `static` or without an EAGLE
    v2 worker), the verify cost profile it was seeded with, and whether draft tiers run."""

    config: AdaspecConfig
    policy: PolicyBase | None = None
    cost_profile: VerifyCostProfile | None = None
    draft_tiers: bool = False
    clock: LoopClock = field(default_factory=LoopClock)


_RUNTIME: Runtime | None = None


def runtime() -> Runtime | None:
    """This process's runtime, or None before the scheduler started (or outside one)."""
    return _RUNTIME


def build_runtime(config: AdaspecConfig, draft_worker) -> Runtime:
    """The policy, seeded with the verify cost profile measured on `draft_worker`'s target."""
    if config.spec_policy == "static" or draft_worker is None:
        return Runtime(config)
    # Every policy gets the verify cost profile: it seeds the latency model they plan with,
    # and adaserve's knee rule takes its budget there unless --adaserve-budget is set.
    profile = profile_verify_cost(draft_worker)
    budget = knee_budget(profile) if profile is not None else None
    policy = build_policy(config, budget)
    if profile is not None:
        # The dummy verify forward runs at a short context; seed with context 0.
        policy.verify_latency.seed(
            [((tokens, 0), ms) for tokens, ms in zip(profile.tokens, profile.latency_ms)]
        )
    policy.stats.cost_profile = profile.as_dict() if profile is not None else None
    if metrics_enabled():
        policy.stats.sinks.append(PrometheusSink())
    logger.info(
        "sgl_adaspec: %s policy: %s; verify cost profile %s",
        config.spec_policy,
        getattr(policy, "config", policy),
        policy.stats.cost_profile or "not available",
    )
    return Runtime(config, policy, profile, config.draft_tiers == "on")


def profile_verify_cost(worker, repeats: int = 3) -> VerifyCostProfile | None:
    """Time the target's verify pass (SGLang's own dummy TARGET_VERIFY forward) for batch sizes
    1, 2, 4, ... up to the running-request limit, i.e. bs * num_draft_tokens verified tokens.
    Returns None (and logs why) if this SGLang build cannot run the dummy forward."""
    try:
        model_runner = worker.target_worker.model_runner
        runner = model_runner.eager_runner
        ntok = model_runner.decode_num_tokens_per_req()
        max_bs = runner._eager_max_bs
        buffers = runner._alloc_dummy_decode_buffers(max_bs, num_tokens_per_req=ntok)
        sizes = sorted({min(2**i, max_bs) for i in range(max_bs.bit_length() + 1)})
        if len(sizes) < 2:
            logger.info("sgl_adaspec: one running request at most; no verify cost profile")
            return None
        latency = []
        for bs in sizes:
            runner._dummy_run(batch_size=bs, buffers=buffers)  # warm-up
            runs = []
            for _ in range(repeats):
                start = time.perf_counter()
                runner._dummy_run(batch_size=bs, buffers=buffers)
                runs.append(1000 * (time.perf_counter() - start))
            latency.append(sorted(runs)[len(runs) // 2])
        return VerifyCostProfile(tuple(bs * ntok for bs in sizes), tuple(latency))
    except Exception:  # a profiling failure must not stop the server: no budget instead
        logger.exception("sgl_adaspec: verify cost profiling failed; policies run without it")
        return None


def scheduler_started(_result, scheduler, *args, **kwargs) -> None:
    """AFTER `Scheduler.__init__`, the plugin's one hook there: read the flags once and build
    the runtime (policy, cost profile) before serving, once the target's model runner is
    complete."""
    global _RUNTIME
    config = AdaspecConfig.from_env()
    logger.info("sgl_adaspec: scheduler uses spec policy %s (%s)", config.spec_policy, config)
    draft_worker = getattr(scheduler, "draft_worker", None)
    if draft_worker is None or not hasattr(draft_worker, "target_worker"):
        draft_worker = None
    _RUNTIME = build_runtime(config, draft_worker)


def _policy() -> PolicyBase | None:
    return _RUNTIME.policy if _RUNTIME is not None else None


# --- hooks -------------------------------------------------------------------------------------


def forward_batch_generation(original: Callable, worker, batch, *args, **kwargs):
    """AROUND `EAGLEWorkerV2.forward_batch_generation`: one iteration scope, timed, and the
    policy's one `observe` of its outcome. A draft depth of 0 runs the iteration as a plain
    decode through SGLang's own steps-0 path (`plain_decode`)."""
    policy = _policy()
    if policy is None:
        return original(worker, batch, *args, **kwargs)
    clock = _RUNTIME.clock
    if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
        clock.last_decode_end_s = None
        return original(worker, batch, *args, **kwargs)
    if batch.forward_mode.is_idle():
        clock.last_decode_end_s = None
        with iteration_scope():
            return original(worker, batch, *args, **kwargs)
    num_requests = len(batch.reqs)
    track_requests(batch.reqs, policy)
    start = clock.cycle_start(time.perf_counter())
    with iteration_scope() as scope:
        scope.draft_shape = policy.draft_shape(
            num_requests, worker.speculative_num_steps, worker.topk
        )
        scope.plain = scope.draft_shape[0] == 0
        if scope.plain:
            with plain_decode(worker):
                verify_start = time.perf_counter()
                result = original(worker, batch, *args, **kwargs)
                scope.verify_ms = 1000 * (time.perf_counter() - verify_start)
                scope.accepted = result.accept_lens
        else:
            if not _RUNTIME.draft_tiers:
                scope.draft_shape = None
            result = original(worker, batch, *args, **kwargs)
    end = time.perf_counter()
    clock.last_decode_end_s = end
    iteration_ms = 1000 * (end - start)
    if scope.plain:
        policy.stats.observe_plain(num_requests)
    elif scope.draft_ran is not None:
        depth, width = scope.draft_ran
        policy.stats.observe_draft(depth, width, (depth - 1) * num_requests * width)
    if scope.verify_ms is not None:
        policy.observe(_outcome(batch, scope, iteration_ms))
    return result


@contextlib.contextmanager
def plain_decode(worker):
    """SGLang 0.5.23's steps-0 iteration: a one-node verify of each request's bonus token (a
    plain decode through the verify graph) and, with SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND,
    no draft extend after it. The next speculative iteration then drafts from a cold state
    (zeroed top-k and hidden state; its path probabilities are 0, so nothing of it is
    verified) and the draft's KV cache lacks the skipped positions; both cost acceptance, not
    correctness: the target still verifies every token."""
    from sglang.srt.environ import envs

    saved = (worker.speculative_num_steps, worker.speculative_num_draft_tokens)
    worker.speculative_num_steps, worker.speculative_num_draft_tokens = 0, 1
    try:
        with envs.SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND.override(True):
            yield
    finally:
        worker.speculative_num_steps, worker.speculative_num_draft_tokens = saved


def _outcome(batch, scope: Iteration, iteration_ms: float) -> Outcome:
    reqs = batch.reqs
    context_tokens = sum(len(req.origin_input_ids) + len(req.output_ids) for req in reqs)
    return make_outcome(
        scope.policy_input,
        scope.decision,
        rids=tuple(req.rid for req in reqs),
        context_tokens=context_tokens,
        accepted=None if scope.accepted is None else scope.accepted.detach().cpu().long(),
        verify_ms=scope.verify_ms,
        iteration_ms=iteration_ms,
        early_exit=scope.early_exit_counts,
    )


def draft_forward(original: Callable, draft_worker, forward_batch):
    """AROUND `EagleDraftWorker.draft_forward`: the beam search at the policy's draft shape."""
    scope = _ITERATION.get()
    if scope is None or forward_batch.forward_mode.is_idle():
        return original(draft_worker, forward_batch)
    tiered = runs_tiers(draft_worker, forward_batch)
    shape = scope.draft_shape if tiered else None
    scope.draft_ran = shape or (draft_worker.speculative_num_steps, draft_worker.topk)
    return run_draft(original, draft_worker, forward_batch, shape)


def organize_draft_results(original: Callable, score_list, token_list, parents_list, num_draft):
    """AROUND `eagle_utils.organize_draft_results`: keep the chosen nodes' path probabilities."""
    parent_list, top_scores_index, draft_tokens = original(
        score_list, token_list, parents_list, num_draft
    )
    scope = _ITERATION.get()
    if scope is not None:
        scores = torch.cat(score_list, dim=1).flatten(1)  # [bs, all expanded nodes]
        scope.path_prob = torch.gather(scores, 1, top_scores_index)
    return parent_list, top_scores_index, draft_tokens


def verify(original: Callable, worker, batch, *args, **kwargs):
    """AROUND `EAGLEWorkerV2.verify`: decide, prune the tree, verify; the outcome goes to the
    iteration scope (observed once by `forward_batch_generation`)."""
    policy = _policy()
    scope = _ITERATION.get()
    if (
        policy is None
        or scope is None
        or scope.plain
        or scope.path_prob is None
        or batch.forward_mode.is_idle()
    ):
        return original(worker, batch, *args, **kwargs)
    verify_input = batch.spec_info
    # The draft tree's parent links, walked once: the candidates, the pruning and the early
    # exit all read them (pruning only unlinks nodes, so kept nodes keep these parents).
    scope.parents = tree_parents(verify_input)
    try:
        it = iteration_input(worker, batch, policy, scope)
        decision = policy.decide(it)
        for req, hopeless in zip(batch.reqs, decision.infeasible.tolist()):
            req._adaspec_state.infeasible |= hopeless
    except Exception:  # the policy must never take the server down: verify the full tree
        logger.exception("sgl_adaspec: policy decision failed; verifying the full tree")
        return original(worker, batch, *args, **kwargs)
    selection = decision.selection
    keep = torch.ones(
        (it.cands.num_requests, it.cands.num_nodes + 1),
        dtype=torch.bool,
        device=it.cands.tokens.device,
    )
    keep[:, 1:] = selection.mask
    prune_tree(verify_input, keep, scope.parents)
    scope.policy_input, scope.decision, scope.keep = it, decision, keep
    start = time.perf_counter()
    result = original(worker, batch, *args, **kwargs)
    scope.verify_ms = 1000 * (time.perf_counter() - start)
    scope.accepted = result.accept_lens
    logits_output = result.logits_output
    if logits_output is not None:
        info = logits_output.customized_info or {}
        info[VERIFIED_TOKENS_KEY] = (selection.counts + 1).tolist()
        logits_output.customized_info = info
    return result


def iteration_input(worker, batch, policy: PolicyBase, scope: Iteration) -> IterationInput:
    """What the policy sees of this iteration (see `IterationInput`)."""
    reqs = batch.reqs
    spec_info = batch.spec_info
    cands = candidates_from_verify_input(spec_info, scope.path_prob, scope.parents)
    depth, width = scope.draft_ran or (worker.speculative_num_steps, worker.topk)
    slo = slo_batch(reqs, policy, policy.baseline_tpot_ms())
    return IterationInput(
        cands=cands,
        slo=slo,
        rids=tuple(req.rid for req in reqs),
        context_lens=torch.tensor(
            [len(req.origin_input_ids) + len(req.output_ids) for req in reqs], dtype=torch.long
        ),
        draft_steps=depth,
        draft_topk=width,
        history=(
            tuple(list(req.origin_input_ids) + list(req.output_ids) for req in reqs)
            if policy.needs_history
            else None
        ),
    )


def target_forward(original: Callable, worker, batch=None, forward_batch=None, *args, **kwargs):
    """AROUND `TpModelWorker.forward_batch_generation`: ragged verify of the kept nodes, with
    the policy's early exit (`verify_exit`) where it asked for one and the model supports it."""
    scope = _ITERATION.get()
    keep = scope.keep if scope is not None else None
    if not kwargs.get("is_verify", False) or keep is None:
        return original(worker, batch, forward_batch, *args, **kwargs)
    spec_info = forward_batch.spec_info
    if not _backend_runs_ragged_verify(worker):
        if scope.decision.early_exit is not None:
            _warn_once(
                "sgl_adaspec: faser early exit runs on the plugin's torch attention backend "
                "(the CPU recipe) only; verifying in full"
            )
        return original(worker, batch, forward_batch, *args, **kwargs)
    run = _exit_run(worker, forward_batch, scope)
    if run is None and bool(keep.all()):
        return original(worker, batch, forward_batch, *args, **kwargs)
    rows = keep.reshape(-1).nonzero().squeeze(1)  # [kept] rows of the [bs * ntok] layout
    full = {name: getattr(forward_batch, name) for name in ("input_ids", "positions", "out_cache_loc")}
    for name, value in full.items():
        setattr(forward_batch, name, value[rows])
    scope.verify_nodes = [row.nonzero().squeeze(1) for row in keep]
    try:
        with exit_run(run):
            result = original(worker, batch, forward_batch, *args, **kwargs)
    finally:
        for name, value in full.items():
            setattr(forward_batch, name, value)
        scope.verify_nodes = None
    if run is not None and run.exited is not None:
        scope.early_exit_counts = (run.tested, int(run.exited.sum()), run.test_ms)
        if bool(run.exited.any()):
            # Exited nodes leave the tree: acceptance stops at their parents (lossless).
            rows = rows[~run.exited]
            keep = torch.zeros_like(keep).view(-1).index_fill_(0, rows, True).view(keep.shape)
            prune_tree(spec_info, keep, scope.parents)
    _scatter_rows(result.logits_output, rows, keep.numel())
    return result


def _exit_run(worker, forward_batch, scope: Iteration) -> ExitRun | None:
    """The early exit of this verify pass, or None (not asked for, not worth it by eq. 10, or
    a setup the hook cannot split: logged once)."""
    plan = scope.decision.early_exit
    if plan is None:
        return None
    causal_lm = worker.model_runner.model
    model = llama_stack(causal_lm)
    if model is None or getattr(worker.model_runner, "tp_size", 1) != 1:
        _warn_once(
            "sgl_adaspec: faser early exit needs a LlamaForCausalLM target of 2+ layers on one "
            "GPU/CPU rank without pipeline stages or aux hidden-state capture; verifying in full"
        )
        return None
    try:
        return _build_exit_run(scope, causal_lm, model, plan, forward_batch)
    except Exception:  # the exit is an optimisation: never fail a verify pass for it
        logger.exception("sgl_adaspec: early-exit set-up failed; verifying in full")
        return None


def _build_exit_run(scope: Iteration, causal_lm, model, plan, forward_batch) -> ExitRun | None:
    """The packed rows' tokens and tree links (see `ExitRun`), if eq. 10 says to test."""
    keep = scope.keep
    bs, ntok = keep.shape
    parents = scope.parents  # [bs, ntok]; kept nodes' parents are kept too
    flat_keep = keep.cpu().reshape(-1)
    rows = flat_keep.nonzero().squeeze(1)
    row_of = torch.full((bs * ntok,), -1, dtype=torch.long)
    row_of[rows] = torch.arange(rows.numel())
    request = torch.arange(bs).repeat_interleave(ntok)
    parent_flat = (parents + request.view(bs, ntok) * ntok).reshape(-1)
    row_parent = torch.where(parents.reshape(-1) >= 0, row_of[parent_flat.clamp(min=0)], -1)[rows]
    if not should_test(model, plan, int((row_parent >= 0).sum())):
        return None
    device = forward_batch.input_ids.device
    return ExitRun(
        plan=plan,
        head_weight=causal_lm.lm_head.weight[: model.vocab_size],
        row_token=forward_batch.spec_info.draft_token.reshape(-1)[rows.to(device)].long(),
        row_parent=row_parent.to(device),
        row_request=request[rows].to(device),
        row_node=(rows % ntok).to(device),
    )


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        logger.warning(message)


def _backend_runs_ragged_verify(worker) -> bool:
    from sgl_adaspec.platform.cpu.attention import TorchTreeAttnBackend

    return isinstance(worker.model_runner.attn_backend, TorchTreeAttnBackend)


def _scatter_rows(logits_output, rows: torch.Tensor, num_rows: int) -> None:
    """Expand per-kept-node outputs back to SGLang's [bs * ntok] rows (the rest stay zero: the
    pruned tree never reads them)."""
    for name in ("next_token_logits", "hidden_states"):
        packed = getattr(logits_output, name, None)
        if packed is None:
            continue
        full = packed.new_zeros((num_rows, *packed.shape[1:]))
        full[rows] = packed
        setattr(logits_output, name, full)


# --- adapters between SGLang objects and the policy's tensors ---------------------------------


def tree_parents(verify_input) -> torch.Tensor:
    """[bs, ntok] int64 (CPU): each node's parent in SGLang's verify tree (node 0 = root),
    NO_NODE for roots and unlinked nodes."""
    links = (verify_input.retrieve_next_token.tolist(), verify_input.retrieve_next_sibling.tolist())
    return torch.tensor(tree_parent_nodes(*links), dtype=torch.long)


def candidates_from_verify_input(
    verify_input, path_prob: torch.Tensor, parents: torch.Tensor
) -> Candidates:
    """SGLang's verify tree (node 0 = root; `parents` from `tree_parents`) as the policy's
    Candidates (root excluded)."""
    bs, ntok = verify_input.retrieve_next_token.shape
    draft_tokens = verify_input.draft_token.view(bs, ntok)
    node_parents = parents[:, 1:] - 1  # root (0) -> -1; unlinked (NO_NODE) -> -2
    # A draft tier's padding nodes carry negative scores (see `draft_tiers`): never candidates.
    valid = (node_parents >= -1) & (path_prob.cpu() >= 0)
    node_parents = torch.where(valid, node_parents, -1)
    prob = path_prob.float().cpu().clamp(0.0, 1.0)
    # f never exceeds the parent's (Candidates checks it); enforce it against rounding.
    has_parent = node_parents >= 0
    for _ in range(ntok - 1):
        parent_prob = torch.gather(prob, 1, node_parents.clamp(min=0))
        capped = torch.where(has_parent, torch.minimum(prob, parent_prob), prob)
        if torch.equal(capped, prob):
            break
        prob = capped
    return Candidates(
        tokens=draft_tokens[:, 1:].long().cpu(),
        parents=node_parents,
        path_prob=prob,
        valid=valid,
    )


def prune_tree(verify_input, keep: torch.Tensor, parents: torch.Tensor) -> None:
    """Unlink every node not in `keep` [bs, ntok] (closed under parent) from the verify tree
    whose parent links are `parents` (`tree_parents`)."""
    next_token = verify_input.retrieve_next_token
    parents = torch.where(keep.cpu(), parents, NO_NODE)
    first_child, next_sib = sibling_links(parents)
    verify_input.retrieve_next_token.copy_(first_child.to(next_token.device))
    verify_input.retrieve_next_sibling.copy_(next_sib.to(next_token.device))


def track_requests(reqs, policy: PolicyBase) -> None:
    """Attach SLO bookkeeping to requests decoding for the first time, in every decode
    iteration, speculative or plain: a request's clock starts at its first decode iteration,
    and one served without speculation still reports its TPOT when it finishes."""
    now = time.perf_counter()
    for req in reqs:
        if getattr(req, "_adaspec_state", None) is None:
            req._adaspec_state = RequestState(request_slo(req), now, len(req.output_ids), policy)


def slo_batch(reqs, policy: PolicyBase, baseline_tpot_ms: float | None) -> SloBatch:
    """The running requests' SLO state (see `track_requests`). Classes relative to the
    baseline TPOT resolve with `baseline_tpot_ms` (best effort while it is unknown)."""
    track_requests(reqs, policy)
    now = time.perf_counter()
    tpot, elapsed, tokens = [], [], []
    for req in reqs:
        state = req._adaspec_state
        target_ms = state.slo.resolve_ms(baseline_tpot_ms)
        tpot.append(target_ms if target_ms is not None else math.nan)
        elapsed.append(1000 * (now - state.decode_start_s))
        tokens.append(len(req.output_ids) - state.tokens_at_start)
    return SloBatch(
        tpot_slo_ms=torch.tensor(tpot, dtype=torch.float64),
        decode_elapsed_ms=torch.tensor(elapsed, dtype=torch.float64),
        tokens_out=torch.tensor(tokens, dtype=torch.float64),
    )


def request_finished(_result, req, *args, **kwargs) -> None:
    """AFTER `Req.update_finish_state`: a finished request reports its TPOT against its SLO."""
    state = getattr(req, "_adaspec_state", None)
    if state is None or state.reported or not req.finished():
        return
    state.reported = True
    state.policy.forget(req.rid)
    tpot_ms = state.tpot_ms(len(req.output_ids), time.perf_counter())
    if tpot_ms is not None:
        target_ms = state.slo.resolve_ms(state.stats.baseline_tpot_ms)
        state.stats.observe_finished(state.slo.slo_class, tpot_ms, target_ms, state.infeasible)


def add_internal_state(_result, controller, state: dict) -> None:
    """AFTER `SchedulerInternalStateController._add_speculative`: `/server_info` shows the
    policy's state under internal_states[i]["adaspec"]."""
    state_of = runtime()
    policy = _policy()
    config = state_of.config if state_of is not None else AdaspecConfig.from_env()
    pool_stats = controller.scheduler.pool_stats_observer.get_pool_stats()
    state["adaspec"] = {
        "spec_policy": config.spec_policy,
        "stats": policy.stats.as_dict() if policy is not None else None,
        # KV slots held by requests now (radix-cached, evictable prefixes excluded), computed
        # on each call unlike the periodically published `sglang:num_used_tokens`.
        "kv_tokens_used": int(pool_stats.full_num_used),
    }


def register(registry, hook_type) -> None:
    around = hook_type.AROUND
    registry.register(
        "sglang.srt.managers.schedule_batch.Req.update_finish_state",
        request_finished,
        hook_type.AFTER,
    )
    registry.register(
        "sglang.srt.managers.scheduler_components.internal_state."
        "SchedulerInternalStateController._add_speculative",
        add_internal_state,
        hook_type.AFTER,
    )
    worker = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2"
    registry.register(
        "sglang.srt.managers.scheduler.Scheduler.__init__", scheduler_started, hook_type.AFTER
    )
    registry.register(f"{worker}.forward_batch_generation", forward_batch_generation, around)
    registry.register(f"{worker}.verify", verify, around)
    registry.register(
        "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.draft_forward",
        draft_forward,
        around,
    )
    registry.register(
        "sglang.srt.speculative.eagle_utils.organize_draft_results", organize_draft_results, around
    )
    registry.register(
        "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation",
        target_forward,
        around,
    )
    registry.register("sglang.srt.models.llama.LlamaModel.forward", llama_model_forward, around)
