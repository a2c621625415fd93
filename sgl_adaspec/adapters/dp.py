"""SGLang adapter of the SLO-aware data-parallel dispatch (`--slo-dispatch on`; the rule:
`dp_dispatch.py`).

SGLang's DP controller (`managers/data_parallel_controller.py`) sends each request to a replica
by a count: round robin, total requests or total tokens. It knows nothing of SLOs. Each replica's
scheduler does: the SLO clocks of its requests and its latency model. So:
- the launcher makes a folder for the replicas' reports and names it in `STATE_DIR_ENV`
  (`prepare_state_dir`, from `cli.from_cli_args`); every child process inherits it;
- on each replica, the scheduler of TP rank 0 writes its report to `dp<rank>.json`: the TPOT
  SLOs of its requests and its per-token time by requests (`ReplicaReporter`). It rewrites the
  file when a request starts or finishes decoding, at most every `REPORT_INTERVAL_S`, and at
  once when its last request finishes. Each write replaces the file whole;
- the controller (AFTER `DataParallelController.__init__`) dispatches through `SloDispatcher`.
  It takes SGLang's own count of requests in flight per replica, from SGLang's load snapshots,
  refreshed at most every 20 ms. It takes the SLOs and per-token times from the reports. Between
  refreshes it counts what it sent itself, as SGLang's DPBudget does.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from sgl_adaspec.config import AdaspecConfig
from sgl_adaspec.scheduler.dp_dispatch import ReplicaLoad, choose_replica
from sgl_adaspec.scheduler.request_slo import parse_request_slo

logger = logging.getLogger(__name__)

STATE_DIR_ENV = "ADASPEC_DP_STATE_DIR"
REPORT_INTERVAL_S = 0.05
# How long the controller counts a request it sent before the replica's report lists it (it is
# listed once it decodes; until then it waits in the replica's queue).
PENDING_S = 2.0
READ_INTERVAL_S = 0.02
# Points of a report's per-token curve: requests 1..MAX_CURVE_REQUESTS.
MAX_CURVE_REQUESTS = 64


STATE_DIR_PREFIX = "sgl_adaspec_dp_"


def prepare_state_dir(config: AdaspecConfig) -> None:
    """In the launcher: the reports' folder for this server, named after the launcher's pid.
    Removed when the launcher exits normally; a killed launcher's folder is removed by the
    next launcher that finds its pid gone."""
    if config.slo_dispatch != "on" or os.environ.get(STATE_DIR_ENV):
        return
    root = Path(tempfile.gettempdir())
    for old in root.glob(f"{STATE_DIR_PREFIX}*_*"):
        pid = old.name[len(STATE_DIR_PREFIX) :].split("_", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    folder = tempfile.mkdtemp(prefix=f"{STATE_DIR_PREFIX}{os.getpid()}_")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ[STATE_DIR_ENV] = folder


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def report_path(dp_rank: int) -> Path | None:
    folder = os.environ.get(STATE_DIR_ENV)
    return Path(folder) / f"dp{dp_rank}.json" if folder else None


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


@dataclass
class ReplicaReporter:
    """A replica's report, kept by its rank-0 scheduler: the resolved TPOT SLO of each request
    decoding there, by request id."""

    path: Path
    max_requests: int
    slos_ms: dict[str, float] = field(default_factory=dict)
    changed: bool = True
    last_write_s: float = -math.inf

    def track(self, rid: str, slo_ms: float | None) -> None:
        if slo_ms is not None and math.isfinite(slo_ms):
            self.slos_ms[rid] = slo_ms
            self.changed = True

    def finish(self, rid: str) -> None:
        if self.slos_ms.pop(rid, None) is not None:
            self.changed = True

    def maybe_write(self, policy, now_s: float) -> bool:
        """Rewrite the report if it changed and the last write is old enough (at once when no
        SLO is left: a replica must not look tight after its last tight request left)."""
        if not self.changed:
            return False
        if self.slos_ms and now_s - self.last_write_s < REPORT_INTERVAL_S:
            return False
        report = {
            "slos_ms": self.slos_ms,
            "tpot_ms_by_requests": tpot_curve(policy, self.max_requests),
            "baseline_tpot_ms": policy.baseline_tpot_ms(),
        }
        partial = self.path.with_suffix(".tmp")
        partial.write_text(json.dumps(report))
        os.replace(partial, self.path)
        self.changed, self.last_write_s = False, now_s
        return True


def reporter_of_scheduler(config: AdaspecConfig, leads: bool) -> ReplicaReporter | None:
    """This scheduler's reporter: on TP rank 0 of a replica when `--slo-dispatch on` runs."""
    if config.slo_dispatch != "on" or not leads:
        return None
    from sglang.srt.runtime_context import get_parallel, get_schedule

    path = report_path(get_parallel().dp_rank or 0)
    if path is None:
        return None
    max_requests = min(get_schedule().max_running_requests or MAX_CURVE_REQUESTS, 64)
    return ReplicaReporter(path, max(max_requests, 1))


def read_report(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # not written yet
        return None


class SloDispatcher:
    """The controller's dispatch under `--slo-dispatch on` (replaces its `dispatching`)."""

    def __init__(self, controller) -> None:
        self.controller = controller
        self.slo_config = AdaspecConfig.from_env().load_slo_config()
        self.reports: dict[int, dict] = {}
        # Per replica: requests sent with an SLO that its report does not list yet,
        # rid -> (SLO ms, when sent).
        self.pending: dict[int, dict[str, tuple[float, float]]] = {}
        self.last_read_s = -math.inf

    def __call__(self, req) -> None:
        controller = self.controller
        if controller.maybe_external_dp_rank_routing(req):
            return
        active = list(controller._active_workers)
        if not active:
            raise RuntimeError("No active DP workers are available for routing.")
        now = time.monotonic()
        self.refresh(now)
        slo_ms = self.request_slo_ms(req)
        rank = active[choose_replica([self.replica_load(r) for r in active], slo_ms)]
        # Counted here until SGLang's next load snapshot, as its DPBudget does.
        controller.dp_budget.total_requests[rank] += 1
        if slo_ms is not None:
            self.pending.setdefault(rank, {})[req.rid] = (slo_ms, now)
        send(controller.workers[rank], req)

    def refresh(self, now: float) -> None:
        """SGLang's requests in flight per replica (its own throttled refresh) and the
        replicas' reports (read at most every `READ_INTERVAL_S`: a burst dispatches on the
        same reports and its own counts, as SGLang's DPBudget does)."""
        self.controller.refresh_load_budget()
        if now - self.last_read_s < READ_INTERVAL_S:
            return
        self.last_read_s = now
        for rank in range(len(self.controller.workers)):
            path = report_path(rank)
            report = read_report(path) if path is not None else None
            if report is not None:
                self.reports[rank] = report
            listed = self.reports.get(rank, {}).get("slos_ms", {})
            pending = self.pending.get(rank, {})
            for rid in [
                r for r, (_, sent) in pending.items() if r in listed or now - sent > PENDING_S
            ]:
                del pending[rid]

    def replica_load(self, rank: int) -> ReplicaLoad:
        report = self.reports.get(rank, {})
        requests = self.controller.dp_budget.total_requests[rank]
        slos = list(report.get("slos_ms", {}).values()) if requests > 0 else []
        slos += [slo for slo, _ in self.pending.get(rank, {}).values()]
        return ReplicaLoad(requests, tuple(slos), tuple(report.get("tpot_ms_by_requests", ())))

    def request_slo_ms(self, req) -> float | None:
        """The request's TPOT SLO in ms (classes relative to the baseline resolved with the
        replicas' reported baseline); None: best effort."""
        baseline = next(
            (r["baseline_tpot_ms"] for r in self.reports.values() if r.get("baseline_tpot_ms")),
            None,
        )
        params = getattr(getattr(req, "sampling_params", None), "custom_params", None)
        try:
            slo = parse_request_slo(params, self.slo_config)
        except ValueError:  # refused at the HTTP edge already; here: best effort
            return None
        target = slo.resolve_ms(baseline)
        return target if target is not None and math.isfinite(target) else None


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
        "sgl_adaspec: DP dispatch by SLO across %d replicas (in place of --load-balance-method %s)",
        len(controller.workers),
        str(replaced).lower(),
    )


# With --sleep-on-idle the controller wakes at least this often to feed its watchdog.
IDLE_WAKE_MS = 1000


def controller_event_loop(original, controller) -> None:
    """AROUND `DataParallelController.event_loop`: with `--sleep-on-idle`, wait on the
    tokenizer's socket instead of polling it. SGLang's loop polls without pause and keeps a
    core busy while the server is idle (80 % of one here), which `--sleep-on-idle` asks not to."""
    from sglang.srt.runtime_context import get_device

    if not get_device().sleep_on_idle:
        return original(controller)
    import zmq
    from sglang.srt.managers.data_parallel_controller import sock_recv

    poller = zmq.Poller()
    poller.register(controller.recv_from_tokenizer, zmq.POLLIN)
    while True:
        controller.soft_watchdog.feed()
        poller.poll(IDLE_WAKE_MS)
        while True:
            try:
                request = sock_recv(controller.recv_from_tokenizer, flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                break
            controller._request_dispatcher(request)


