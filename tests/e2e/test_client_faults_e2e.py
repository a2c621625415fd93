"""Clients that go away mid-request: streams dropped after a few chunks, client timeouts, with
mixed SLOs, under adaserve and tetris. The server keeps serving, its KV pool and the plugin's
per-request state return to idle, every request sent is reported to the plugin's statistics
(SGLang counts the dropped streams as aborted), and a later greedy request's output is unchanged."""

from __future__ import annotations

import concurrent.futures

import pytest
import requests

from sgl_adaspec.local_server import client
from sgl_adaspec.local_server.launch import eagle_flags

from .conftest import start, wait_until

LONG = 200  # tokens a faulty client asks for and never reads to the end
SLOS = ({"tpot_slo_ms": 5.0}, {"slo_class": "chat"}, None)


def dropped_stream(url: str, prompt: str, custom_params) -> int:
    """Reads three chunks of a stream, then closes the connection."""
    params = {"max_new_tokens": LONG, "temperature": 0.0, "ignore_eos": True}
    if custom_params is not None:
        params["custom_params"] = custom_params
    body = {"text": prompt, "sampling_params": params, "stream": True}
    with requests.post(f"{url}/generate", json=body, stream=True, timeout=120) as response:
        chunks = 0
        for line in response.iter_lines():
            chunks += line.startswith(b"data:")
            if chunks == 3:
                break
    return chunks


def timed_out(url: str, prompt: str, custom_params) -> bool:
    """A client that gives up before the answer comes."""
    params = {"max_new_tokens": LONG, "temperature": 0.0, "ignore_eos": True}
    if custom_params is not None:
        params["custom_params"] = custom_params
    try:
        requests.post(
            f"{url}/generate", json={"text": prompt, "sampling_params": params}, timeout=0.5
        )
    except requests.Timeout:
        return True
    return False


def idle_state(url: str) -> dict:
    """/server_info's adaspec state once no request holds KV or the plugin's SLO state."""
    return wait_until(
        lambda: requests.get(f"{url}/server_info", timeout=60).json()["internal_states"][0][
            "adaspec"
        ],
        lambda state: state["kv_tokens_used"] == 0 and state["stats"]["open_requests"] == 0,
        "the server back to idle",
    )


def finished(adaspec_state: dict) -> int:
    return sum(c["finished"] for c in adaspec_state["stats"]["classes"].values())


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["adaserve", "tetris"])
def test_clients_that_go_away_leave_the_server_serving_and_idle(
    models, tmp_path_factory, plain_server, policy
):
    prompt = "def fibonacci(n):"
    reference = client.generate(plain_server.url, prompt, 16, None, 0.0)["output_ids"]
    flags = eagle_flags(models.eagle_draft, steps=4, topk=2, num_draft_tokens=8)
    server = start(
        tmp_path_factory, f"faults-{policy}", models.target, *flags, "--spec-policy", policy,
        "--enable-metrics",
    )  # fmt: skip
    try:
        before = finished(idle_state(server.url))  # SGLang's warm-up request included
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            drops = [pool.submit(dropped_stream, server.url, prompt, slo) for slo in SLOS]
            timeouts = [pool.submit(timed_out, server.url, prompt, slo) for slo in SLOS]
            assert [job.result() for job in drops] == [3] * len(SLOS)
            assert all(job.result() for job in timeouts)
        state = idle_state(server.url)
        # Every request sent is reported to the plugin's statistics, finished or aborted, and
        # SGLang counts each dropped stream as aborted.
        sent = 2 * len(SLOS)
        assert finished(state) == before + sent, state["stats"]["classes"]
        metrics = requests.get(f"{server.url}/metrics", timeout=60).text
        aborted = sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("sglang:num_aborted_requests_total")
        )
        assert aborted >= len(SLOS), metrics
        # The server keeps serving: a later greedy request is unchanged.
        again = client.generate(server.url, prompt, 16, {"tpot_slo_ms": 50.0}, 0.0)
        assert again["output_ids"] == reference
        assert set(state["fallbacks"].values()) == {0}
    finally:
        server.stop()
