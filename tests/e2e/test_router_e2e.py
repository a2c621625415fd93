"""Two single servers with the plugin behind `sglang-router` (PyPI `sglang-router`, SGLang's
Rust router, real processes on CPU): a mixed-SLO burst through the router is answered in full
with greedy outputs equal to one server's asked alone, and each server counts the SLO
classes of the requests it served, so the SLOs crossed the router.

sglang-router 0.3.2 re-serializes requests from its own types: it keeps `custom_params` on
/v1/completions and OpenAI's `metadata` on /v1/chat/completions, and drops `custom_params` on
/generate and chat (docs/parallel.md); the burst uses the two that cross it."""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
import time

import pytest
import requests

from sgl_adaspec.local_server.launch import eagle_flags, free_port

from .conftest import start
from .mixed_batch import MAX_NEW_TOKENS, PROMPTS

BURST = PROMPTS * 3
CHATS = 2


def complete(url: str, prompt: str, custom_params: dict | None) -> str:
    body = {"model": "default", "prompt": prompt, "max_tokens": MAX_NEW_TOKENS, "temperature": 0}
    if custom_params is not None:
        body["custom_params"] = custom_params
    response = requests.post(f"{url}/v1/completions", json=body, timeout=300)
    response.raise_for_status()
    return response.json()["choices"][0]["text"]


def chat(url: str, metadata: dict) -> None:
    body = {
        "model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
        "temperature": 0, "metadata": metadata,
    }  # fmt: skip
    requests.post(f"{url}/v1/chat/completions", json=body, timeout=300).raise_for_status()


def start_router(worker_urls: list[str], log_path) -> tuple[subprocess.Popen, str]:
    """`sglang_router.launch_router` in front of `worker_urls`, round robin; waits until every
    worker is registered and healthy (its /health answers before it registers any)."""
    port, metrics_port = free_port(), free_port()
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [
                sys.executable, "-m", "sglang_router.launch_router",
                "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
                "--prometheus-port", str(metrics_port), "--worker-urls", *worker_urls,
            ],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"router exited with {process.returncode}: {log_path.read_text()}")
        try:
            ready = requests.get(f"{url}/readiness", timeout=2)
            if ready.ok and ready.json().get("healthy_workers") == len(worker_urls):
                return process, url
        except (requests.RequestException, ValueError):
            pass
        time.sleep(1.0)
    process.kill()
    raise TimeoutError(f"router not ready after 120 s: {log_path.read_text()}")


def finished_per_class(url: str) -> dict[str, int]:
    state = requests.get(f"{url}/server_info", timeout=60).json()["internal_states"][0]["adaspec"]
    return {name: c["finished"] for name, c in state["stats"]["classes"].items()}


@pytest.mark.slow  # ~2 min: two servers and the router
def test_two_servers_behind_sglang_router(models, tmp_path_factory):
    flags = (
        *eagle_flags(models.bigram_eagle_draft, steps=4, topk=2, num_draft_tokens=8),
        "--spec-policy", "adaserve",
    )  # fmt: skip
    servers = []
    router = None
    try:
        # One OpenMP thread each, on its own core.
        for core in ("0", "1"):
            env = {"SGLANG_CPU_OMP_THREADS_BIND": core}
            servers.append(
                start(tmp_path_factory, f"routed-{core}", models.bigram_target, *flags, env=env)
            )
        router, url = start_router(
            [server.url for server in servers], tmp_path_factory.mktemp("router") / "router.log"
        )
        reference = [complete(servers[0].url, prompt, None) for prompt, _ in PROMPTS]
        before = [finished_per_class(server.url) for server in servers]
        with concurrent.futures.ThreadPoolExecutor(len(BURST) + CHATS) as pool:
            chats = [pool.submit(chat, url, {"slo_class": "chat"}) for _ in range(CHATS)]
            outputs = list(pool.map(lambda job: complete(url, *job), BURST))
            for done in chats:
                done.result()
        after = [finished_per_class(server.url) for server in servers]
    finally:
        if router is not None:
            router.kill()
            router.wait()
        for server in servers:
            server.stop()
    assert outputs == reference * 3
    served = [
        {name: count - b.get(name, 0) for name, count in a.items()}
        for a, b in zip(after, before, strict=True)
    ]
    # Six requests carried a custom TPOT SLO through the router, two an SLO class in their
    # metadata, three none; round robin gave each server a share.
    assert sum(s.get("custom", 0) for s in served) == 6, served
    assert sum(s.get("chat", 0) for s in served) == CHATS, served
    assert sum(s.get("best_effort", 0) for s in served) == 3, served
    assert all(sum(s.values()) > 0 for s in served), served
    for server in servers:
        assert "Traceback" not in server.log_path.read_text()
