"""The replicas' reports to the DP controller ride SGLang's own load snapshots
(`managers/load_snapshot.py`), so they go wherever SGLang's per-scheduler load goes: through
shared memory on one node, and by zmq PUSH to node 0 (where a collector copies them into the
shared memory) when schedulers run on other nodes or `SGLANG_LOAD_SNAPSHOT_USE_ZMQ=1`.

- Scheduler (AFTER `SchedulerLoadInquirer.get_loads`): the snapshot SGLang publishes becomes a
  `ReportedLoadSnapshot`, SGLang's `LoadSnapshot` with one more optional field, `adaspec`.
  SGLang encodes snapshots with a generic msgpack encoder, so the field goes on the wire as is;
  it adds about 14 bytes per listed SLO and 9 per point of the per-token curve to the slot.
- Scheduler (BEFORE `Scheduler.publish_load_snapshot`): publish at once when the report is due
  (SGLang publishes every 15 decode iterations by default; a report must not wait that long).
- Every reader (REPLACE of `load_snapshot.snapshot_decoder`): SGLang decodes with a decoder of
  `LoadSnapshot`, which drops fields it does not know; both decode sites (the shared-memory
  slot reader and the zmq collector, which re-encodes what it decodes) look the decoder up at
  call time, and decode `ReportedLoadSnapshot` instead. Readers that use a `LoadSnapshot`'s
  fields (`/v1/loads`, DP budgets) see a subclass and nothing else changes.
- Controller (AROUND `load_snapshot.zmq_reader_owner`): on the zmq path exactly one process of
  node 0 collects, and SGLang gives that role to the DP controller only under a load-aware
  `--load-balance-method`; otherwise the HTTP process collects only when `/v1/loads` is
  asked. Under `--slo-dispatch on` the controller reads snapshots on every dispatch, so it
  collects.
"""

from __future__ import annotations

import msgspec
import msgspec.msgpack
from sglang.srt.managers.load_snapshot import LoadSnapshot

from sgl_adaspec.config import AdaspecConfig
from sgl_adaspec.scheduler.replica_report import ReplicaReport


class ReportWire(msgspec.Struct, array_like=True):
    """`ReplicaReport` on the wire: parallel lists, no field names."""

    rid_keys: list[int]
    slos_ms: list[float]
    tpot_ms_by_requests: list[float]
    baseline_tpot_ms: float | None = None


class ReportedLoadSnapshot(LoadSnapshot):
    """SGLang's load snapshot with the replica's report (None: this scheduler reports none)."""

    adaspec: ReportWire | None = None


def to_wire(report: ReplicaReport) -> ReportWire:
    return ReportWire(
        list(report.slos_ms), list(report.slos_ms.values()), list(report.tpot_ms_by_requests),
        report.baseline_tpot_ms,
    )  # fmt: skip


def report_of(snapshot) -> ReplicaReport | None:
    """The report a snapshot carries, or None."""
    wire = getattr(snapshot, "adaspec", None)
    if wire is None:
        return None
    return ReplicaReport(
        dict(zip(wire.rid_keys, wire.slos_ms)), tuple(wire.tpot_ms_by_requests),
        wire.baseline_tpot_ms,
    )  # fmt: skip


class SnapshotDecoder:
    """Stands in for `load_snapshot.snapshot_decoder` (a module attribute SGLang calls
    `.decode(data)` on)."""

    type = ReportedLoadSnapshot
    decode = staticmethod(msgspec.msgpack.Decoder(ReportedLoadSnapshot).decode)


def with_report(snapshot, _inquirer):
    """AFTER `SchedulerLoadInquirer.get_loads`: the snapshot with this replica's report, on the
    scheduler that keeps one (`--slo-dispatch on`, TP rank 0 of each replica)."""
    from sgl_adaspec.adapters.speculative.fallbacks import Fallback, fell_back
    from sgl_adaspec.adapters.speculative.runtime import now_s, replica_reporter

    reporter = replica_reporter()
    if reporter is None:
        return None
    try:
        wire = to_wire(reporter.current(now_s()))
    except Exception as exc:  # the controller keeps the older report: never stop publishing
        fell_back(Fallback.REPLICA_REPORT, exc)
        return None
    fields = {name: getattr(snapshot, name) for name in snapshot.__struct_fields__}
    return ReportedLoadSnapshot(**fields, adaspec=wire)


def publish_when_report_due(scheduler, force: bool = False, **kwargs):
    """BEFORE `Scheduler.publish_load_snapshot`: forced when the report is due."""
    from sgl_adaspec.adapters.speculative.runtime import now_s, replica_reporter

    reporter = replica_reporter()
    if force or reporter is None or not reporter.due(now_s()):
        return None
    return (scheduler,), {**kwargs, "force": True}


def controller_collects(original, caller: str) -> bool:
    """AROUND `load_snapshot.zmq_reader_owner(caller)`: under `--slo-dispatch on`, on node 0
    on the zmq path, the DP controller binds the collector and no other process does."""
    owner = original(caller)
    if AdaspecConfig.from_env().slo_dispatch != "on":
        return owner
    from sglang.srt.managers.load_snapshot import should_use_zmq
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    if not should_use_zmq() or parallel.node_rank != 0 or parallel.num_dp_ranks < 2:
        return owner
    return caller == "DataParallelController"


def transport(reader) -> str:
    """How the snapshots the controller reads reach it."""
    from sglang.srt.managers.load_snapshot import ZmqShmLoadSnapshotReader

    if isinstance(reader, ZmqShmLoadSnapshotReader):
        return "zmq to node 0, then shared memory"
    return "shared memory"


class ReportingReader:
    """The controller's snapshot reader, handing every snapshot SGLang reads (at its own
    throttled `refresh_load_budget`, at most every 20 ms) to `receive` as well."""

    def __init__(self, reader, receive) -> None:
        self.reader = reader
        self.receive = receive

    def read_all(self) -> list:
        loads = self.reader.read_all()
        self.receive(loads)
        return loads

    def __getattr__(self, name):
        return getattr(self.reader, name)
