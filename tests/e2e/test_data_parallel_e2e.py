"""Two data-parallel replicas (`--dp 2`, real SGLang on CPU) behind SGLang's DP controller with
the plugin's SLO-aware dispatch (`--slo-dispatch on`): the config reaches both replicas'
schedulers, the controller dispatches on both replicas' reports (carried in SGLang's load
snapshots: shared memory, or the zmq path SGLang takes when schedulers run on other nodes,
forced on one node by SGLang's own `SGLANG_LOAD_SNAPSHOT_USE_ZMQ=1`), a burst of mixed SLOs
(ms targets, absolute and relative classes, best effort) is answered in full with greedy
outputs token-identical to one server without speculation, and `/server_info` and Prometheus
report per replica. SGLang 0.5.23 refuses `--dp` with `--nnodes 2` (docs/parallel.md)."""

from __future__ import annotations

import concurrent.futures
import re
import time

import psutil
import pytest
import requests

from sgl_adaspec.local_server.launch import eagle_flags

from .conftest import metric_values, start
from .mixed_batch import MAX_NEW_TOKENS, PROMPTS, generate
from .test_tensor_parallel_e2e import TP2_ENV

CLASSES = ("coding", "chat", "summarization")  # relative (1.2x baseline), 50 ms, 150 ms
BURST = PROMPTS * 2 + tuple((prompt, {"slo_class": c}) for (prompt, _), c in zip(PROMPTS, CLASSES))
TRANSPORTS = {
    "shared memory": {},
    "zmq to node 0, then shared memory": {"SGLANG_LOAD_SNAPSHOT_USE_ZMQ": "1"},
}
SUMMARY = re.compile(
    r"DP dispatch: (\d+) requests, (\d+) on every replica's report \(replicas \[0, 1\], (.+?)\)"
)


def pinned_generate(url: str, prompt: str, rank: int) -> dict:
    """A best-effort greedy request sent to replica `rank` by SGLang's own routing field."""
    body = {
        "text": prompt,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": MAX_NEW_TOKENS},
        "routed_dp_rank": rank,
    }
    response = requests.post(f"{url}/generate", json=body, timeout=300)
    response.raise_for_status()
    return response.json()


def controller_cpu_seconds(launcher_pid: int, idle_s: float) -> float:
    """CPU seconds SGLang's DP controller process spends over `idle_s` seconds of no requests."""
    (controller,) = [
        p for p in psutil.Process(launcher_pid).children(recursive=True)
        if "data_parallel_controller" in p.name()
    ]  # fmt: skip
    before = sum(controller.cpu_times()[:2])
    time.sleep(idle_s)
    return sum(controller.cpu_times()[:2]) - before


@pytest.mark.slow  # ~85 s each
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_two_replicas_dispatched_by_slo(models, tmp_path_factory, bigram_pair_reference, transport):
    server = start(
        tmp_path_factory, "dp2-slo", models.bigram_target,
        *eagle_flags(models.bigram_eagle_draft, steps=4, topk=2, num_draft_tokens=8),
        "--dp", "2", "--spec-policy", "adaserve", "--slo-dispatch", "on", "--enable-metrics",
        # one OpenMP thread per replica, each on its own core
        env={**TP2_ENV, **TRANSPORTS[transport]},
    )  # fmt: skip
    try:
        # One request pinned to each replica (SGLang's `routed_dp_rank`, which the dispatch
        # leaves alone): both serve whatever their start-up curves make the rule choose (a
        # profile measured under contention once reported 0.0 ms per token for one replica,
        # and the whole burst went there).
        pinned = [pinned_generate(server.url, PROMPTS[2][0], rank) for rank in (0, 1)]
        with concurrent.futures.ThreadPoolExecutor(len(BURST)) as pool:
            outputs = list(pool.map(lambda job: generate(server.url, *job), BURST))
        info = requests.get(f"{server.url}/server_info", timeout=60).json()
        metrics = metric_values(requests.get(f"{server.url}/metrics", timeout=60).text)
        idle_cpu_s = controller_cpu_seconds(server.process.pid, idle_s=3.0)
    finally:
        server.stop()
    assert [out["output_ids"] for out in outputs] == bigram_pair_reference * 3  # PROMPTS' order
    assert [out["output_ids"] for out in pinned] == [bigram_pair_reference[2]] * 2
    # --sleep-on-idle: the DP controller waits on its socket (SGLang's own loop spins a core,
    # ~2.4 s of CPU in 3 s here).
    assert idle_cpu_s < 0.5, idle_cpu_s
    log = server.log_path.read_text()
    assert "sgl_adaspec: DP dispatch by SLO across 2 replicas" in log
    assert f"their reports ride SGLang's load snapshots ({transport})" in log
    assert "Traceback" not in log
    # The controller holds each replica's report, read from SGLang's snapshots, and decided
    # the whole burst on both (a request decided without every replica's report is counted
    # "by request count": only start-up's warm-up, before the first reports).
    for rank in (0, 1):
        assert f"DP dispatch has replica {rank}'s report ({transport})" in log
    summaries = [m.groups() for m in SUMMARY.finditer(log)]
    assert {where for _, _, where in summaries} == {transport}, summaries
    assert sum(int(on_reports) for _, on_reports, _ in summaries) >= len(BURST), summaries

    states = [state["adaspec"] for state in info["internal_states"]]
    assert len(states) == 2 and all(s["spec_policy"] == "adaserve" for s in states)
    finished = [{name: c["finished"] for name, c in s["stats"]["classes"].items()} for s in states]
    # Four custom-SLO requests, each counted once, on either replica; one of each class; best
    # effort: two, the pinned ones (one per replica) and the start-up warm-up requests.
    assert sum(f.get("custom", 0) for f in finished) == 4
    assert all(sum(f.get(c, 0) for f in finished) == 1 for c in CLASSES), finished
    assert sum(f.get("best_effort", 0) for f in finished) >= 4
    assert all(f.get("best_effort", 0) >= 1 for f in finished), finished  # both replicas served
    # The server's total, the same on every replica's entry.
    totals = [state["adaspec_total"] for state in info["internal_states"]]
    assert totals[0] == totals[1] and totals[0]["replicas"] == 2
    for slo_class in ("custom", "best_effort"):
        assert totals[0]["classes"][slo_class]["finished"] == sum(
            f.get(slo_class, 0) for f in finished
        )
    # Prometheus: one series per replica (internal_states come in no set order); a bare
    # tpot_slo_ms is labelled by its TPOT bucket (mixed_batch's 5 ms and 5 s).
    labels = {"custom": ("custom_le_5ms", "custom_gt_2000ms"), "best_effort": ("best_effort",)}
    for slo_class, names in labels.items():
        series = [
            sum(
                metrics.get(
                    f'sglang_adaspec:requests_finished_total{{dp_rank="{rank}",slo_class="{name}"}}',
                    0.0,
                )
                for name in names
            )
            for rank in (0, 1)
        ]
        assert sorted(series) == sorted(f.get(slo_class, 0) for f in finished)
