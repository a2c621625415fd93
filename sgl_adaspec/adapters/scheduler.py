"""SGLang scheduler adapter: SLO-aware admission and prefill bounding, queue-limit messages.

When SLO-aware scheduling is active (`--slo-admission`, on by default for adaserve):
- AFTER `SchedulePolicy.calc_priority(waiting_queue, ...)`, which orders the queue in place
  before every prefill admission: re-order it by `scheduler.admission.admission_order`;
- BEFORE `PrefillAdder.__init__`: cap this iteration's prefill tokens by
  `scheduler.prefill_bound.prefill_token_budget` so a long prompt cannot push running requests
  with tight TPOT SLOs off their track (cost per token from the start-up verify profile).
With it off (e.g. `--spec-policy static`) neither changes anything. Under tensor parallelism
both are decided on rank 0 and broadcast (`adapters/speculative/tp_sync.py`): they read clocks,
and every rank must build the same batch.
"""

from __future__ import annotations

from sgl_adaspec.config import AdaspecConfig
from sgl_adaspec.scheduler.admission import AdmissionConfig, WaitingRequest, admission_order
from sgl_adaspec.scheduler.cost_model import marginal_ms_per_token
from sgl_adaspec.scheduler.prefill_bound import RunningSlo, prefill_token_budget
from sgl_adaspec.scheduler.request_slo import RequestSlo, parse_request_slo


def request_slo(req) -> RequestSlo:
    """The request's parsed SLO, cached on SGLang's Req (validated already at the HTTP edge)."""
    slo = getattr(req, "_adaspec_slo", None)
    if slo is None:
        config = AdaspecConfig.from_env()
        slo = parse_request_slo(req.sampling_params.custom_params, config.load_slo_config())
        req._adaspec_slo = slo
    return slo


def order_waiting_queue(_result, schedule_policy, waiting_queue, *args, **kwargs) -> None:
    config = AdaspecConfig.from_env()
    if not config.slo_admission_active or len(waiting_queue) < 2:
        return
    from sgl_adaspec.adapters.speculative.runtime import now_s, tp_sync

    sync = tp_sync()
    order = None
    if sync.leads:
        admission = AdmissionConfig(max_wait_ms=config.admission_max_wait_ms)
        waiting = [
            WaitingRequest(
                arrival_s=req.time_stats.scheduler_recv_time,
                ttft_slo_ms=request_slo(req).ttft_slo_ms,
                prompt_tokens=len(req.origin_input_ids),
            )
            for req in waiting_queue
        ]
        order = admission_order(waiting, now_s(), admission)
    order = sync.value(order)
    waiting_queue[:] = [waiting_queue[i] for i in order]


# PrefillAdder.__init__(self, page_size, tree_cache, allocator, running_batch,
#                      new_token_ratio, rem_input_tokens, rem_chunk_tokens, ...)
_RUNNING_BATCH, _REM_INPUT, _REM_CHUNK = 4, 6, 7


def bound_prefill(*args, **kwargs):
    """BEFORE `PrefillAdder.__init__`: lower the prefill token limits when running requests
    with tight TPOT SLOs cannot afford a long prefill (see `scheduler/prefill_bound.py`)."""
    if len(args) <= _REM_CHUNK or not AdaspecConfig.from_env().slo_admission_active:
        return None
    from sgl_adaspec.adapters.speculative.runtime import tp_sync

    sync = tp_sync()
    limit = args[_REM_CHUNK] if args[_REM_CHUNK] is not None else args[_REM_INPUT]
    budget = sync.value(_prefill_budget(args[_RUNNING_BATCH], limit) if sync.leads else None)
    if budget is None or budget >= limit:
        return None
    args = list(args)
    args[_REM_INPUT] = min(args[_REM_INPUT], budget)
    if args[_REM_CHUNK] is not None:
        args[_REM_CHUNK] = budget
    return tuple(args), kwargs


def _prefill_budget(running_batch, limit: int) -> int | None:
    """This iteration's prefill token budget, or None (no running request with an SLO clock)."""
    from sgl_adaspec.adapters.speculative.runtime import now_s, runtime

    reqs = getattr(running_batch, "reqs", None) or []
    tracked = [(r, r._adaspec_state) for r in reqs if getattr(r, "_adaspec_state", None)]
    # Requests found unable to meet their SLO even alone are served best effort: no say here.
    tracked = [(r, state) for r, state in tracked if not state.infeasible]
    plugin_state = runtime()
    profile = plugin_state.cost_profile if plugin_state is not None and tracked else None
    if profile is None:
        return None
    cost = marginal_ms_per_token(profile)
    now = now_s()
    running = [
        RunningSlo(
            tpot_slo_ms=state.slo.resolve_ms(state.stats.baseline_tpot_ms),
            decode_elapsed_ms=1000 * (now - state.first_token_s),
            tokens_out=state.tokens_decoded(len(req.output_ids)),
        )
        for req, state in tracked
    ]
    return prefill_token_budget(running, cost, chunk_limit=limit)


QUEUE_FULL = "The request queue is full."


def queue_full_message(finished_reason: dict, limit: int | None) -> dict:
    """SGLang's rejection beyond `--max-queued-requests`, with the limit named."""
    if not isinstance(finished_reason, dict) or finished_reason.get("message") != QUEUE_FULL:
        return finished_reason
    return {
        **finished_reason,
        "message": f"The request queue is full: {limit} requests are waiting, the limit set by "
        "--max-queued-requests; retry later.",
    }


def name_queue_limit(req, finished_reason=None):
    """BEFORE `scheduler._make_abort_req(req, finished_reason)`: only the message text changes."""
    from sglang.srt.runtime_context import get_schedule

    if finished_reason is None:
        return None
    named = queue_full_message(finished_reason, get_schedule().max_queued_requests)
    return (req,), {"finished_reason": named}


