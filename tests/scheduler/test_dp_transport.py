"""The replicas' reports ride SGLang's load snapshots (`adapters/dp_transport.py`), tested as
SGLang's own unit test of load snapshots tests them (`test_load_snapshot.py` in SGLang's
repository, not shipped in the wheel): real writers and readers of
`sglang.srt.managers.load_snapshot` in one process, shared memory in a temporary file, and the
multi-node path (zmq PUSH to node 0's collector, which copies into shared memory) over an
`ipc://` address, one writer per replica as on separate nodes. The controller's dispatcher
(`adapters/dp.py`) then reads them through a fake of SGLang's controller (the attributes it
reads; its refresh is SGLang's, `DataParallelController.refresh_load_budget`)."""

from __future__ import annotations

import logging
import os
import tempfile
import time
from types import SimpleNamespace

import msgspec
import pytest
from sglang.srt.managers import load_snapshot
from sglang.srt.managers.load_snapshot import (
    SLOT_SIZE,
    DisaggregationMetrics,
    LoadSnapshot,
    LoRAMetrics,
    MemoryMetrics,
    QueueMetrics,
    ShmLoadSnapshotReader,
    ShmLoadSnapshotWriter,
    SpeculativeMetrics,
    ZmqLoadSnapshotWriter,
    ZmqShmLoadSnapshotReader,
)

from sgl_adaspec.adapters import dp as dp_adapter
from sgl_adaspec.adapters import dp_transport
from sgl_adaspec.adapters.dp_transport import (
    ReportedLoadSnapshot,
    SnapshotDecoder,
    controller_collects,
    publish_when_report_due,
    report_of,
    to_wire,
    with_report,
)
from sgl_adaspec.adapters.speculative import runtime as plugin_runtime
from sgl_adaspec.config import AdaspecConfig
from sgl_adaspec.scheduler.replica_report import MAX_LISTED, ReplicaReporter, rid_key
from tests.e2e.test_data_parallel_e2e import SUMMARY

CURVE = (10.0, 20.0, 30.0, 40.0)


@pytest.fixture(autouse=True)
def plugin_decoder(monkeypatch):
    """The decoder SGLang's readers use once the plugin's hooks are applied."""
    monkeypatch.setattr(load_snapshot, "snapshot_decoder", SnapshotDecoder)
    monkeypatch.setenv("ADASPEC_CONFIG", AdaspecConfig(spec_policy="adaserve").to_json())


def temp_path() -> str:
    fd, path = tempfile.mkstemp(prefix="adaspec_test_loads_")
    os.close(fd)
    os.unlink(path)
    return path


def ipc_addr() -> str:
    return f"ipc://{temp_path()}.sock"


def report(slos: dict[str, float], curve=CURVE, baseline=10.0):
    reporter = ReplicaReporter(lambda: curve, lambda: baseline)
    for rid, slo in slos.items():
        reporter.track(rid, slo)
    return reporter.current(0.0)


def snapshot(rank: int, requests: int, slos: dict[str, float], **kwargs) -> ReportedLoadSnapshot:
    return ReportedLoadSnapshot(
        dp_rank=rank, timestamp=time.time(), num_running_reqs=requests,
        adaspec=to_wire(report(slos, **kwargs)),
    )  # fmt: skip


def warm_up(writers, reader, attempts=40):
    """Until the collector has heard every writer (zmq connects asynchronously)."""
    for _ in range(attempts):
        for writer in writers:
            writer.write(LoadSnapshot(dp_rank=writer.dp_rank, timestamp=-1.0))
        time.sleep(0.05)
        if {load.dp_rank for load in reader.read_all()} >= {w.dp_rank for w in writers}:
            return
    raise RuntimeError("zmq warm-up failed")


def test_a_report_crosses_shared_memory_and_sglangs_own_decoder_still_reads_the_snapshot():
    path = temp_path()
    writer = ShmLoadSnapshotWriter(path, dp_size=2, dp_rank=1)
    reader = ShmLoadSnapshotReader(path, dp_size=2)
    try:
        writer.write(snapshot(1, 2, {"a": 25.0}))
        (load,) = reader.read_all()
        assert load.num_running_reqs == 2
        assert report_of(load) == report({"a": 25.0})
        # A reader without the plugin's decoder: SGLang's fields, the report dropped.
        offset = load_snapshot.slot_offset(1) + load_snapshot.SLOT_LEN_STRUCT.size
        (length,) = load_snapshot.SLOT_LEN_STRUCT.unpack_from(reader.mmap, offset - 4)
        plain = msgspec.msgpack.Decoder(LoadSnapshot).decode(reader.mmap[offset : offset + length])
        assert type(plain) is LoadSnapshot and plain.num_running_reqs == 2
    finally:
        reader.close()
        writer.close()
        os.unlink(path)


def test_a_full_report_fits_sglangs_snapshot_slot():
    slos = {f"request-{i:032d}": 10.0 + i for i in range(MAX_LISTED + 100)}
    full = ReportedLoadSnapshot(
        dp_rank=0, timestamp=time.time(), num_running_reqs=300,
        adaspec=to_wire(report(slos, curve=tuple(float(i) for i in range(64)))),
        decode_moments=[1e9] * 6, memory=MemoryMetrics(1.0, 1.0, 1.0, 10**9),
        speculative=SpeculativeMetrics(3.5, 0.7), lora=LoRAMetrics(1, 8, 0.1),
        disaggregation=DisaggregationMetrics("decode", 1, 2, 3, 4, 5, 1.0, 2.0),
        queues=QueueMetrics(1, 2, 3, 4, 5),
    )  # fmt: skip
    size = len(load_snapshot.snapshot_encoder.encode(full))
    assert size < SLOT_SIZE // 2, size  # the writer refuses (and SGLang loses it) past the slot


def test_reports_of_replicas_on_other_nodes_reach_the_collector_by_zmq():
    """Two replicas, each as on its own node: zmq PUSH to node 0's collector (SGLang's
    `TestEndToEndZmqSimulation` set-up); the controller reads them from node 0's shared
    memory, as SGLang's does."""
    addr, shm = ipc_addr(), temp_path()
    collector = ZmqShmLoadSnapshotReader(addr, shm, dp_size=2)
    writers = [ZmqLoadSnapshotWriter(addr, dp_size=2, dp_rank=rank) for rank in (0, 1)]
    try:
        warm_up(writers, collector)
        writers[0].write(snapshot(0, 1, {"x": 25.0}))
        writers[1].write(snapshot(1, 1, {"y": 500.0}, baseline=30.0))
        time.sleep(0.05)
        loads = {load.dp_rank: load for load in collector.read_all()}
        assert report_of(loads[0]) == report({"x": 25.0})
        assert report_of(loads[1]) == report({"y": 500.0}, baseline=30.0)
        # Plain ShmLoadSnapshotReader on node 0 (the HTTP process's /v1/loads) sees them too.
        reader = ShmLoadSnapshotReader(shm, dp_size=2)
        assert report_of(reader.read(1)).baseline_tpot_ms == 30.0
        reader.close()
    finally:
        for writer in writers:
            writer.close()
        collector.close()
        os.unlink(shm)


class FakeController:
    """What SGLang's DP controller gives the dispatcher; its refresh reads the snapshots and
    sets the requests in flight from them, as `refresh_load_budget` / `DPBudget` do."""

    def __init__(self, reader, replicas=2):
        self.workers = [f"w{rank}" for rank in range(replicas)]
        self._active_workers = list(range(replicas))
        self.dp_budget = SimpleNamespace(total_requests=[0] * replicas)
        self.load_snapshot_reader = reader

    def refresh_load_budget(self):
        for load in self.load_snapshot_reader.read_all():
            self.dp_budget.total_requests[load.dp_rank] = (
                load.num_running_reqs + load.num_waiting_reqs
            )

    def maybe_external_dp_rank_routing(self, req):
        return False


def request(rid, **custom_params):
    return SimpleNamespace(rid=rid, sampling_params=SimpleNamespace(custom_params=custom_params))


@pytest.fixture
def sent(monkeypatch):
    sent = []
    monkeypatch.setattr(dp_adapter, "send", lambda worker, req: sent.append((worker, req.rid)))
    return sent


def test_the_dispatcher_decides_on_the_remote_replicas_report(sent, caplog):
    """Replica 1 writes from "another node" (zmq); a request that only its report makes
    safe to send there goes there, and the controller's book holds that report."""
    addr, shm = ipc_addr(), temp_path()
    collector = ZmqShmLoadSnapshotReader(addr, shm, dp_size=2)
    writers = [ZmqLoadSnapshotWriter(addr, dp_size=2, dp_rank=rank) for rank in (0, 1)]
    try:
        warm_up(writers, collector)
        dispatcher = dp_adapter.SloDispatcher(FakeController(collector))
        assert dispatcher.transport == "zmq to node 0, then shared memory"
        # Replica 0 holds a 15 ms request that one more would push to 20 ms per token;
        # replica 1, with a 50 ms one, has room. By count alone it is a tie.
        writers[0].write(snapshot(0, 1, {"x": 15.0}))
        writers[1].write(snapshot(1, 1, {"y": 50.0}))
        time.sleep(0.05)
        dispatcher(request("new", tpot_slo_ms=40.0))
        assert sent == [("w1", "new")]
        assert dispatcher.book.reports[1] == report({"y": 50.0})
        assert dispatcher.book.load(1, 2).slos_ms == (50.0, 40.0)  # counted until listed
        assert dispatcher.tally["reports"] == 1
        with caplog.at_level(logging.INFO, logger=dp_adapter.logger.name):
            dispatcher.summarize()
        assert SUMMARY.search(caplog.text).groups() == ("1", "1", dispatcher.transport)
        assert not dispatcher.tally  # counted afresh after each summary
        # Replica 1's next report lists it: counted from the report alone.
        writers[1].write(snapshot(1, 2, {"y": 50.0, "new": 40.0}))
        time.sleep(0.05)
        dispatcher.controller.refresh_load_budget()
        assert sorted(dispatcher.book.load(1, 2).slos_ms) == [40.0, 50.0]
    finally:
        for writer in writers:
            writer.close()
        collector.close()
        os.unlink(shm)


def test_relative_classes_resolve_with_each_replicas_reported_baseline(sent, monkeypatch, tmp_path):
    classes = tmp_path / "classes.yaml"
    classes.write_text("classes:\n  coding:\n    baseline_multiple: 1.2\n")
    config = AdaspecConfig(spec_policy="adaserve", slo_config=str(classes))
    monkeypatch.setenv("ADASPEC_CONFIG", config.to_json())
    path = temp_path()
    writers = [ShmLoadSnapshotWriter(path, dp_size=2, dp_rank=rank) for rank in (0, 1)]
    reader = ShmLoadSnapshotReader(path, dp_size=2)
    try:
        # Replica 1 is three times slower (baseline 30 ms): 1.2x its baseline is 36 ms, which
        # it meets alone (33 ms); replica 0 is loaded past 12 ms per token.
        writers[0].write(snapshot(0, 2, {}, curve=(11.0, 13.0, 15.0), baseline=10.0))
        writers[1].write(snapshot(1, 0, {}, curve=(33.0, 40.0), baseline=30.0))
        dispatcher = dp_adapter.SloDispatcher(FakeController(reader))
        dispatcher(request("c", slo_class="coding"))
        assert sent == [("w1", "c")]
        assert dispatcher.book.load(1, 1).slos_ms == (pytest.approx(36.0),)
    finally:
        for writer in writers:
            writer.close()
        reader.close()
        os.unlink(path)


def test_without_reports_the_dispatcher_sends_to_the_fewest_requests(sent):
    path = temp_path()
    writers = [ShmLoadSnapshotWriter(path, dp_size=2, dp_rank=rank) for rank in (0, 1)]
    reader = ShmLoadSnapshotReader(path, dp_size=2)
    try:
        writers[0].write(LoadSnapshot(dp_rank=0, timestamp=1.0, num_running_reqs=3))
        writers[1].write(LoadSnapshot(dp_rank=1, timestamp=1.0, num_running_reqs=1))
        dispatcher = dp_adapter.SloDispatcher(FakeController(reader))
        dispatcher(request("a", tpot_slo_ms=30.0))
        dispatcher(request("b"))
        assert [worker for worker, _ in sent] == ["w1", "w1"]
        assert dispatcher.tally == {"count": 2}
    finally:
        for writer in writers:
            writer.close()
        reader.close()
        os.unlink(path)


@pytest.fixture
def replica(monkeypatch):
    reporter = ReplicaReporter(lambda: CURVE, lambda: 10.0)
    monkeypatch.setattr(plugin_runtime, "replica_reporter", lambda: reporter)
    monkeypatch.setattr(plugin_runtime, "now_s", lambda: 100.0)
    return reporter


def test_the_scheduler_publishes_its_report_in_its_snapshot_and_at_once_when_due(replica):
    plain = LoadSnapshot(dp_rank=1, timestamp=5.0, num_running_reqs=2, num_waiting_reqs=1)
    replica.track("a", 25.0)
    reported = with_report(plain, None)
    assert isinstance(reported, ReportedLoadSnapshot)
    assert (reported.dp_rank, reported.num_running_reqs, reported.num_waiting_reqs) == (1, 2, 1)
    assert report_of(reported).slos_ms == {rid_key("a"): 25.0}
    assert publish_when_report_due("scheduler") is None  # just built: not due
    replica.finish("a")  # none left: due at once
    assert publish_when_report_due("scheduler", force=False) == (("scheduler",), {"force": True})
    assert publish_when_report_due("scheduler", force=True) is None  # forced anyway


def test_a_scheduler_without_a_report_publishes_sglangs_snapshot(monkeypatch):
    monkeypatch.setattr(plugin_runtime, "replica_reporter", lambda: None)
    assert with_report(LoadSnapshot(dp_rank=0), None) is None  # SGLang's result stands
    assert publish_when_report_due("scheduler") is None


@pytest.mark.parametrize(
    ("zmq", "node_rank", "owners"),
    [
        (True, 0, {"DataParallelController"}),
        (True, 1, set()),  # a node other than 0 collects nothing
        (False, 0, set()),  # shared memory: no collector
    ],
)
def test_under_slo_dispatch_the_controller_collects_zmq_snapshots(
    monkeypatch, zmq, node_rank, owners
):
    from sglang.srt import runtime_context

    monkeypatch.setattr(load_snapshot, "should_use_zmq", lambda: zmq)
    parallel = SimpleNamespace(node_rank=node_rank, num_dp_ranks=2)
    monkeypatch.setattr(runtime_context, "get_parallel", lambda: parallel)

    def sglang_owner(caller):  # SGLang's answer under --load-balance-method round_robin
        return zmq and node_rank == 0 and caller == "TokenizerManager"

    callers = ("TokenizerManager", "MultiTokenizerRouter", "DataParallelController")
    config = AdaspecConfig(spec_policy="adaserve", slo_dispatch="on")
    monkeypatch.setenv("ADASPEC_CONFIG", config.to_json())
    assert {c for c in callers if controller_collects(sglang_owner, c)} == owners
    monkeypatch.setenv("ADASPEC_CONFIG", AdaspecConfig(spec_policy="adaserve").to_json())
    assert {c for c in callers if controller_collects(sglang_owner, c)} == {
        c for c in callers if sglang_owner(c)
    }


def test_transport_names_the_path():
    assert dp_transport.transport(object()) == "shared memory"
