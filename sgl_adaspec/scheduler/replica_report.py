"""A data-parallel replica's report to the SLO-aware dispatcher, and the dispatcher's book of
the reports it has. Pure logic; SGLang carries the reports in its own load snapshots
(`adapters/dp_transport.py`), the replica's side and the controller's are `adapters/dp.py`.

A report holds the TPOT SLOs of the requests decoding on the replica, its per-token time by
number of requests, and its baseline TPOT (relative SLO classes resolve against it). Requests
are listed by a 32-bit key of their id: the report must fit SGLang's load-snapshot slot
(16 KiB, shared with SGLang's own fields), so it lists the tightest `MAX_LISTED` SLOs at most.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sgl_adaspec.scheduler.dp_dispatch import ReplicaLoad

# The report is rebuilt at most this often while SLOs are listed (at once when none is left:
# a replica must not look tight after its last tight request left).
REPORT_INTERVAL_S = 0.05
# How long the dispatcher counts a request it sent before the replica's report lists it (it
# is listed once it decodes; until then it waits in the replica's queue).
PENDING_S = 2.0
# SLOs a report lists at most, the tightest: about 14 bytes each on the wire. Only the
# tightest SLO in force enters a margin; one left off is counted as pending until PENDING_S.
MAX_LISTED = 256


def rid_key(rid: str) -> int:
    """A request id as reports list it. A collision only ends a pending count early."""
    return zlib.crc32(rid.encode())


@dataclass(frozen=True)
class ReplicaReport:
    slos_ms: Mapping[int, float]  # by rid_key
    tpot_ms_by_requests: tuple[float, ...] = ()
    baseline_tpot_ms: float | None = None


@dataclass
class ReplicaReporter:
    """A replica's report, kept by its rank-0 scheduler: the resolved TPOT SLO of each request
    decoding there. `curve` and `baseline` read the replica's latency model when the report is
    rebuilt."""

    curve: Callable[[], tuple[float, ...]]
    baseline: Callable[[], float | None]
    slos_ms: dict[str, float] = field(default_factory=dict)
    changed: bool = True
    built_s: float = -math.inf
    report: ReplicaReport | None = None

    def track(self, rid: str, slo_ms: float | None) -> None:
        if slo_ms is not None and math.isfinite(slo_ms):
            self.slos_ms[rid] = slo_ms
            self.changed = True

    def finish(self, rid: str) -> None:
        if self.slos_ms.pop(rid, None) is not None:
            self.changed = True

    def due(self, now_s: float) -> bool:
        """Whether the report changed and may be rebuilt now."""
        if not self.changed:
            return False
        return not self.slos_ms or now_s - self.built_s >= REPORT_INTERVAL_S

    def current(self, now_s: float) -> ReplicaReport:
        """The report, rebuilt first when it is due."""
        if self.report is None or self.due(now_s):
            tightest = sorted(self.slos_ms.items(), key=lambda item: item[1])[:MAX_LISTED]
            self.report = ReplicaReport(
                {rid_key(rid): slo for rid, slo in tightest}, tuple(self.curve()), self.baseline()
            )
            self.changed, self.built_s = False, now_s
        return self.report


@dataclass
class ReportBook:
    """The dispatcher's view of the replicas: the last report of each, and per replica the
    requests it sent with an SLO that the replica's report does not list yet,
    rid_key -> (SLO ms, when sent)."""

    reports: dict[int, ReplicaReport] = field(default_factory=dict)
    pending: dict[int, dict[int, tuple[float, float]]] = field(default_factory=dict)

    def receive(self, rank: int, report: ReplicaReport) -> None:
        self.reports[rank] = report
        pending = self.pending.get(rank, {})
        for key in [key for key in pending if key in report.slos_ms]:
            del pending[key]

    def sent(self, rank: int, rid: str, slo_ms: float | None, now_s: float) -> None:
        if slo_ms is not None:
            self.pending.setdefault(rank, {})[rid_key(rid)] = (slo_ms, now_s)

    def expire(self, now_s: float) -> None:
        for pending in self.pending.values():
            for key in [key for key, (_, sent) in pending.items() if now_s - sent > PENDING_S]:
                del pending[key]

    def baseline_ms(self, rank: int) -> float | None:
        report = self.reports.get(rank)
        return report.baseline_tpot_ms if report is not None else None

    def load(self, rank: int, requests: int) -> ReplicaLoad:
        """Replica `rank` with `requests` in flight (SGLang's count): the SLOs its report
        lists (none when SGLang counts none: the report is older) and those sent since."""
        report = self.reports.get(rank)
        slos = list(report.slos_ms.values()) if report is not None and requests > 0 else []
        slos += [slo for slo, _ in self.pending.get(rank, {}).values()]
        curve = report.tpot_ms_by_requests if report is not None else ()
        return ReplicaLoad(requests, tuple(slos), curve)
