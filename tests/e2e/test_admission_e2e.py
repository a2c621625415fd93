"""SLO-aware admission on a real server that runs one request at a time: a request with a tight
TTFT target that arrives behind a queue of best-effort requests is admitted ahead of them."""

from __future__ import annotations

import concurrent.futures
import time

import pytest
import requests

from sgl_adaspec.local_server.launch import eagle_flags

from .conftest import scheduler_load, start, wait_until


def finish_order(url: str) -> list[str]:
    def send(name: str, custom_params: dict, max_new_tokens: int):
        body = {
            "text": f"# request {name}\ndef f(x):",
            "sampling_params": {
                "temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True,
                "custom_params": custom_params,
            },
        }  # fmt: skip
        requests.post(f"{url}/generate", json=body, timeout=300).raise_for_status()
        return name, time.perf_counter()

    # One request runs at a time: be1 runs while each later one joins the queue, and each is
    # sent once the server reports the one before it queued, so the arrival order is known.
    jobs = [
        ("be1", {}, 400), ("be2", {}, 48), ("be3", {}, 48), ("urgent", {"ttft_slo_ms": 50}, 48),
    ]  # fmt: skip
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        futures = []
        for queued, job in enumerate(jobs):
            futures.append(pool.submit(send, *job))
            wait_until(
                lambda: scheduler_load(url),
                lambda load, queued=queued: load["num_running_reqs"] == 1
                and load["num_waiting_reqs"] == queued,
                f"{job[0]} queued behind be1",
            )
        done = [future.result() for future in futures]
    return [name for name, _ in sorted(done, key=lambda item: item[1])]


# In the slow tier, which CI runs: ~30 s each on 2 cores.
@pytest.mark.slow
@pytest.mark.parametrize("admission", ["on", "off"])
def test_urgent_ttft_request_is_admitted_first(models, tmp_path_factory, admission):
    flags = (
        *eagle_flags(models.eagle_draft), "--spec-policy", "adaserve",
        "--slo-admission", admission, "--max-running-requests", "1",
        # Aging far beyond the test's duration: the order is decided by slack alone.
        "--admission-max-wait-ms", "600000",
    )  # fmt: skip
    server = start(tmp_path_factory, f"admission-{admission}", models.target, *flags)
    try:
        order = finish_order(server.url)
    finally:
        server.stop()
    if admission == "on":
        assert order.index("urgent") < order.index("be3"), order
    else:
        assert order[-1] == "urgent", order


def prefill_chunks(log_text: str) -> list[int]:
    """#new-token of every prefill batch in a server log."""
    return [
        int(line.split("#new-token: ")[1].split(",")[0])
        for line in log_text.splitlines()
        if "Prefill batch" in line
    ]


@pytest.mark.slow
def test_without_slo_admission_a_long_prefill_runs_in_one_piece(models, tmp_path_factory):
    """SGLang's own behaviour is kept when SLO-aware scheduling is off: the 1200-token prompt is
    prefilled in one batch next to the running request. (With it on, the bound depends on how
    far ahead of its SLO the running request is on this machine: see test_sglang_adapter.py.)"""
    flags = (*eagle_flags(models.eagle_draft), "--spec-policy", "adaserve",
             "--slo-admission", "off")  # fmt: skip
    server = start(tmp_path_factory, "prefill-off", models.target, *flags)

    # The running request streams, so the long prompt is sent only once it is decoding, and it
    # is long enough (ignore_eos) to still be running when the long prompt arrives on any host:
    # a 200-token request without ignore_eos had finished within the 1 s the test used to wait.
    body = {
        "text": "def f(x):", "stream": True,
        "sampling_params": {
            "temperature": 0, "max_new_tokens": 1500, "ignore_eos": True,
            "custom_params": {"tpot_slo_ms": 20},
        },
    }  # fmt: skip
    try:
        with requests.post(f"{server.url}/generate", json=body, stream=True, timeout=300) as running:
            running.raise_for_status()
            next(line for line in running.iter_lines() if line.startswith(b"data:"))
            # SGLang logs the running request's prefill before it streams its first token; only
            # what is logged from here on can be the long prompt. (SGLang's own #running-req in
            # that log line reads 0 when the prompt arrives right after that first token.)
            log_offset = len(server.log_path.read_bytes())
            long = server.generate("x = 1\n" * 300, 4)  # 1200 prompt tokens
    finally:
        server.stop()
    assert long["meta_info"]["prompt_tokens"] == 1200
    log_after = server.log_path.read_bytes()[log_offset:].decode(errors="replace")
    # The running request's own prefill (5 tokens) can still be in the file's unread tail when
    # its first token arrives (the scheduler's log is another process's buffered stream).
    assert [chunk for chunk in prefill_chunks(log_after) if chunk != 5] == [1200]
