"""SGLang adapter of the SLO-aware data-parallel dispatch (`--slo-dispatch on`; the rule:
`scheduler/dp_dispatch.py`, the reports: `scheduler/replica_report.py`).

SGLang's DP controller (`managers/data_parallel_controller.py`) sends each request to a replica
by a count: round robin, total requests or total tokens. It knows nothing of SLOs. Each replica's
scheduler does: the SLO clocks of its requests and its latency model. So:
- on each replica, the scheduler of TP rank 0 keeps a report (`ReplicaReporter`): the TPOT SLOs
  of the requests decoding there, its per-token time by requests, and its baseline TPOT;
- the report rides the load snapshot that scheduler publishes for SGLang's own DP balancing
  (`dp_transport.py`): shared memory on one node, zmq to node 0 across nodes;
- the controller (AFTER `DataParallelController.__init__`) dispatches through `SloDispatcher`.
  It takes SGLang's own count of requests in flight per replica and the reports from the same
  snapshots, read at SGLang's own throttled refresh (at most every 20 ms). Between refreshes it
  counts what it sent itself, as SGLang's DPBudget does.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

import torch

from sgl_adaspec.adapters.dp_transport import ReportingReader, report_of, transport
from sgl_adaspec.config import AdaspecConfig
from sgl_adaspec.scheduler.dp_dispatch import choose_replica, targets_ms
from sgl_adaspec.scheduler.replica_report import ReplicaReporter, ReportBook
from sgl_adaspec.scheduler.request_slo import RequestSlo, parse_request_slo

logger = logging.getLogger(__name__)

# Points of a report's per-token curve: requests 1..MAX_CURVE_REQUESTS.
MAX_CURVE_REQUESTS = 64


def tpot_curve(policy, max_requests: int) -> list[float]:
    """The policy's per-token time with 1..max_requests requests decoding plain, one token
    each: its fit of whole plain iterations once it has some, its verify-pass fit before."""
    requests = torch.arange(1, max_requests + 1, dtype=torch.float64)
    plain = policy.plain_latency
    if plain.num_observations >= 2:
        curve = plain.predict_tensor(requests, 0.0)
    else:
        curve = policy.verify_latency.predict_tensor(requests, 0.0)
    return [] if curve is None else [round(float(ms), 3) for ms in curve]


def reporter_of_scheduler(config: AdaspecConfig, leads: bool, policy) -> ReplicaReporter | None:
    """This scheduler's reporter: on TP rank 0 of a replica when `--slo-dispatch on` runs."""
    if config.slo_dispatch != "on" or not leads:
        return None
    from sglang.srt.runtime_context import get_schedule

    points = max(min(get_schedule().max_running_requests or MAX_CURVE_REQUESTS, 64), 1)
    return ReplicaReporter(lambda: tuple(tpot_curve(policy, points)), policy.baseline_tpot_ms)


class SloDispatcher:
    """The controller's dispatch under `--slo-dispatch on` (replaces its `dispatching`)."""

    def __init__(self, controller) -> None:
        self.controller = controller
        self.slo_config = AdaspecConfig.from_env().load_slo_config()
        self.book = ReportBook()
        # Dispatches since the last summary: on every replica's report, or by request count.
        self.tally: Counter[str] = Counter()
        self.transport = transport(controller.load_snapshot_reader)
        controller.load_snapshot_reader = ReportingReader(
            controller.load_snapshot_reader, self.receive
        )

    def receive(self, loads) -> None:
        for load in loads:
            report = report_of(load)
            if report is None:
                continue
            if load.dp_rank not in self.book.reports:
                logger.info(
                    "sgl_adaspec: DP dispatch has replica %d's report (%s): per-token time "
                    "%s ms alone, baseline TPOT %s ms",
                    load.dp_rank, self.transport,
                    report.tpot_ms_by_requests[0] if report.tpot_ms_by_requests else "unknown",
                    report.baseline_tpot_ms,
                )  # fmt: skip
            self.book.receive(load.dp_rank, report)

    def __call__(self, req) -> None:
        controller = self.controller
        if controller.maybe_external_dp_rank_routing(req):
            return
        active = list(controller._active_workers)
        if not active:
            raise RuntimeError("No active DP workers are available for routing.")
        now = time.monotonic()
        controller.refresh_load_budget()  # SGLang's own throttle; `receive` sees the reports
        self.book.expire(now)
        budget = controller.dp_budget.total_requests
        loads = [self.book.load(rank, budget[rank]) for rank in active]
        targets = targets_ms(self.request_slo(req), [self.book.baseline_ms(r) for r in active])
        index = choose_replica(loads, targets)
        rank = active[index]
        self.tally["reports" if all(load.tpot_ms_by_requests for load in loads) else "count"] += 1
        # Counted here until SGLang's next load snapshot, as its DPBudget does.
        budget[rank] += 1
        self.book.sent(rank, req.rid, targets[index], now)
        send(controller.workers[rank], req)

    def request_slo(self, req) -> RequestSlo | None:
        params = getattr(getattr(req, "sampling_params", None), "custom_params", None)
        try:
            return parse_request_slo(params, self.slo_config)
        except ValueError:  # refused at the HTTP edge already; here: best effort
            return None

    def summarize(self) -> None:
        """One log line for the dispatches since the last (the controller calls it when idle)."""
        if not self.tally:
            return
        logger.info(
            "sgl_adaspec: DP dispatch: %d requests, %d on every replica's report (replicas %s, "
            "%s), %d by request count",
            self.tally.total(), self.tally["reports"], sorted(self.book.reports), self.transport,
            self.tally["count"],
        )  # fmt: skip
        self.tally.clear()


def send(worker, req) -> None:
    from sglang.srt.managers.data_parallel_controller import sock_send

    sock_send(worker, req)


def controller_started(_result, controller, *args, **kwargs) -> None:
    """AFTER `DataParallelController.__init__`: dispatch by SLO under `--slo-dispatch on`."""
    if AdaspecConfig.from_env().slo_dispatch != "on":
        return
    controller.dispatching = SloDispatcher(controller)
    replaced = getattr(controller.load_balance_method, "name", controller.load_balance_method)
    logger.info(
        "sgl_adaspec: DP dispatch by SLO across %d replicas (in place of --load-balance-method "
        "%s); their reports ride SGLang's load snapshots (%s)",
        len(controller.workers),
        str(replaced).lower(),
        controller.dispatching.transport,
    )


# With --sleep-on-idle the controller wakes at least this often to feed its watchdog.
IDLE_WAKE_MS = 1000


def controller_event_loop(original, controller) -> None:
    """AROUND `DataParallelController.event_loop`: with `--sleep-on-idle`, wait on the
    tokenizer's socket instead of polling it. SGLang's loop polls without pause and keeps a
    core busy while the server is idle (80 % of one here), which `--sleep-on-idle` asks not to.
    When no request came for `IDLE_WAKE_MS`, it logs the SLO dispatch's summary."""
    from sglang.srt.runtime_context import get_device

    if not get_device().sleep_on_idle:
        return original(controller)
    import zmq
    from sglang.srt.managers.data_parallel_controller import sock_recv

    poller = zmq.Poller()
    poller.register(controller.recv_from_tokenizer, zmq.POLLIN)
    while True:
        controller.soft_watchdog.feed()
        if not poller.poll(IDLE_WAKE_MS) and isinstance(controller.dispatching, SloDispatcher):
            controller.dispatching.summarize()
        while True:
            try:
                request = sock_recv(controller.recv_from_tokenizer, flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                break
            controller._request_dispatcher(request)
