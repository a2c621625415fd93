"""SGLang scheduler adapter: SLO-aware admission order of the waiting queue.

AFTER hook on `SchedulePolicy.calc_priority(waiting_queue, ...)`, which sorts the queue in place
before every prefill admission: when SLO-aware admission is active the queue is re-ordered by
`scheduler.admission.admission_order`. With it off (e.g. `--spec-policy static`) nothing changes.
"""

from __future__ import annotations

import time

from sgl_adaspec.config import AdaspecConfig
from sgl_adaspec.scheduler.admission import AdmissionConfig, WaitingRequest, admission_order
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
    admission = AdmissionConfig(max_wait_ms=config.admission_max_wait_ms)
    waiting = [
        WaitingRequest(
            arrival_s=req.time_stats.scheduler_recv_time,
            ttft_slo_ms=request_slo(req).ttft_slo_ms,
            prompt_tokens=len(req.origin_input_ids),
        )
        for req in waiting_queue
    ]
    order = admission_order(waiting, time.perf_counter(), admission)
    waiting_queue[:] = [waiting_queue[i] for i in order]


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


def register(registry, hook_type) -> None:
    registry.register(
        "sglang.srt.managers.schedule_policy.SchedulePolicy.calc_priority",
        order_waiting_queue,
        hook_type.AFTER,
    )
    registry.register(
        "sglang.srt.managers.scheduler._make_abort_req", name_queue_limit, hook_type.BEFORE
    )
