"""Two single servers with the plugin behind `sglang-router` (PyPI `sglang-router`, SGLang's
Rust router, real processes on CPU): mixed-SLO bursts on /generate, chat and completions
through the router are answered in full, with greedy outputs equal to one server's asked alone,
and each server counts the SLO classes of the requests it served (in `/server_info` and in
`/metrics`), so the SLOs crossed the router; each server's fleet view answers.

sglang-router 0.3.2 re-serializes requests from its own types and forwards a fixed set of
headers (docs/parallel.md, `tests/fleet/test_fleet_gateway.py`): the SLO crosses it in
`custom_params` on /v1/completions, in OpenAI's `metadata` on chat and in the
`x-request-id-slo-*` headers everywhere; the first burst uses those. The second goes through the
SLO-aware gateway (`sgl_adaspec/fleet/gateway.py`), which moves `custom_params` into those
headers on /generate and chat, and pins requests through a routing key."""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
import threading
import time

import pytest
import requests

from sgl_adaspec.fleet.gateway import Gateway, serve
from sgl_adaspec.local_server.launch import eagle_flags, free_port

from .conftest import metric_values, start, wait_until
from .mixed_batch import MAX_NEW_TOKENS, PROMPTS

BURST = PROMPTS * 3
CHATS = 2
GENERATES = 3


def complete(url: str, prompt: str, custom_params: dict | None) -> str:
    body = {"model": "default", "prompt": prompt, "max_tokens": MAX_NEW_TOKENS, "temperature": 0}
    if custom_params is not None:
        body["custom_params"] = custom_params
    response = requests.post(f"{url}/v1/completions", json=body, timeout=300)
    response.raise_for_status()
    return response.json()["choices"][0]["text"]


def chat(url: str, metadata: dict | None = None, custom_params: dict | None = None) -> None:
    body = {
        "model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
        "temperature": 0,
    }  # fmt: skip
    if metadata is not None:
        body["metadata"] = metadata
    if custom_params is not None:
        body["custom_params"] = custom_params
    requests.post(f"{url}/v1/chat/completions", json=body, timeout=300).raise_for_status()


def generate(url: str, headers: dict | None = None, custom_params: dict | None = None):
    sampling = {"max_new_tokens": 8, "temperature": 0}
    if custom_params is not None:
        sampling["custom_params"] = custom_params
    body = {"text": "def f(x):", "sampling_params": sampling}
    return requests.post(f"{url}/generate", json=body, headers=headers, timeout=300)


def start_router(worker_urls: list[str], log_path, *flags: str) -> tuple[subprocess.Popen, str]:
    """`sglang_router.launch_router` in front of `worker_urls` (round robin unless `flags`
    say); waits until every worker is registered and healthy (its /health answers before it
    registers any)."""
    port, metrics_port = free_port(), free_port()
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [
                sys.executable, "-m", "sglang_router.launch_router",
                "--host", "127.0.0.1", "--port", str(port),
                "--prometheus-port", str(metrics_port), "--worker-urls", *worker_urls,
                *(flags or ("--policy", "round_robin")),
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


def finished_series(url: str) -> dict[str, float]:
    """`sglang_adaspec:requests_finished_total` by `slo_class` label, from /metrics."""
    prefix = 'sglang_adaspec:requests_finished_total{slo_class="'
    series = metric_values(requests.get(f"{url}/metrics", timeout=60).text)
    return {k[len(prefix) : -2]: v for k, v in series.items() if k.startswith(prefix)}


def served(servers, before: list[dict], read) -> list[dict]:
    """Per server, what `read(url)` counts now less `before`."""
    return [
        {name: count - b.get(name, 0) for name, count in read(server.url).items()}
        for server, b in zip(servers, before, strict=True)
    ]


def total(counts: list[dict], match) -> float:
    return sum(v for c in counts for name, v in c.items() if match(name))


@pytest.fixture(scope="module")
def servers(models, tmp_path_factory):
    flags = (
        *eagle_flags(models.bigram_eagle_draft, steps=4, topk=2, num_draft_tokens=8),
        "--spec-policy", "adaserve", "--enable-metrics",
    )  # fmt: skip
    started = []
    try:
        # One OpenMP thread each, on its own core.
        for core in ("0", "1"):
            env = {"SGLANG_CPU_OMP_THREADS_BIND": core}
            started.append(
                start(tmp_path_factory, f"routed-{core}", models.bigram_target, *flags, env=env)
            )
        yield started
    finally:
        for server in started:
            server.stop()
    for server in started:
        assert "Traceback" not in server.log_path.read_text()


@pytest.fixture
def router_log(tmp_path_factory):
    return tmp_path_factory.mktemp("router") / "router.log"


@pytest.mark.slow  # ~2 min: two servers and the router
def test_two_servers_behind_sglang_router(servers, router_log):
    router, url = start_router([server.url for server in servers], router_log)
    try:
        reference = [complete(servers[0].url, prompt, None) for prompt, _ in PROMPTS]
        before = [finished_per_class(server.url) for server in servers]
        before_series = [finished_series(server.url) for server in servers]
        summarization = {"x-request-id-slo-class": "summarization"}
        with concurrent.futures.ThreadPoolExecutor(len(BURST) + CHATS + GENERATES + 1) as pool:
            chats = [pool.submit(chat, url, {"slo_class": "chat"}) for _ in range(CHATS)]
            generates = [pool.submit(generate, url, summarization) for _ in range(GENERATES)]
            generates.append(pool.submit(generate, url, {"x-request-id-slo-tpot-ms": "45"}))
            outputs = list(pool.map(lambda job: complete(url, *job), BURST))
            for done in chats:
                done.result()
            for done in generates:
                done.result().raise_for_status()
        by_info = served(servers, before, finished_per_class)
        by_metrics = served(servers, before_series, finished_series)
        views = [
            wait_until(
                lambda s=s: requests.get(f"{s.url}/adaspec/slo_load", timeout=60).json(),
                lambda body: body["replicas"][0]["running"] == 0, "the server idle again",
            )
            for s in servers
        ]  # fmt: skip
        # A bad SLO header through the router: its 400 names the header; the servers go on.
        for named, value in (("x-request-id-slo-tpot-ms", "fast"), ("x-request-id-slo-class", "x")):
            response = generate(url, {named: value})
            assert response.status_code == 400 and named in response.text, response.text
        for server in servers:  # each still serves, its requests' SLO read from the header
            assert generate(server.url, {"x-request-id-slo-class": "chat"}).ok
    finally:
        router.kill()
        router.wait()
    assert outputs == reference * 3
    # Through the router: six completions with a custom TPOT SLO and one /generate with one
    # in its header, two chats of class chat (metadata), three /generate of class
    # summarization (header), three completions without an SLO; round robin gave each server
    # a share.
    assert total(by_info, lambda n: n == "custom") == 7, by_info
    assert total(by_info, lambda n: n == "chat") == CHATS, by_info
    assert total(by_info, lambda n: n == "summarization") == GENERATES, by_info
    assert total(by_info, lambda n: n == "best_effort") == 3, by_info
    assert all(sum(s.values()) > 0 for s in by_info), by_info
    # The same in the Prometheus counters (a custom SLO labelled by its TPOT bucket).
    assert total(by_metrics, lambda n: n.startswith("custom_")) == 7, by_metrics
    for name, count in (("chat", CHATS), ("summarization", GENERATES), ("best_effort", 3)):
        assert total(by_metrics, lambda n, name=name: n == name) == count, by_metrics
    for body in views:
        (view,) = body["replicas"]
        assert view["classes"] == {}  # no request decoding
        assert len(view["tpot_ms_by_requests"]) > 1 and len(view["tpot_ms_added"]) == 8
        assert view["slo_classes_ms"]["chat"] == 50.0


@pytest.mark.slow  # ~1 min on the module's servers
def test_the_slo_gateway_in_front_of_the_router(servers, router_log):
    """Through the gateway: `custom_params` on /generate and chat (which the router alone
    drops) reach the servers, and requests are pinned to a server by a learned routing key."""
    router, url = start_router(
        [server.url for server in servers], router_log,
        "--policy", "manual", "--assignment-mode", "min_group",
    )  # fmt: skip
    gateway = Gateway(url, [server.url for server in servers], poll_interval_s=0.2)
    proxy = serve(gateway, "127.0.0.1", free_port())
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    front = f"http://127.0.0.1:{proxy.server_port}"
    try:
        before = [finished_per_class(server.url) for server in servers]
        for _ in range(3):  # one after the other: the gateway learns keys between them
            assert generate(front, custom_params={"slo_class": "summarization"}).ok
            chat(front, custom_params={"slo_class": "chat"})
            assert complete(front, "def f(x):", {"tpot_slo_ms": 5000.0})
            time.sleep(0.5)
        counts = served(servers, before, finished_per_class)
        metrics = [metric_values(requests.get(f"{s.url}/metrics").text) for s in servers]
    finally:
        gateway.stopped.set()
        proxy.shutdown()
        proxy.server_close()
        router.kill()
        router.wait()
    assert total(counts, lambda n: n == "summarization") == 3, counts
    assert total(counts, lambda n: n == "chat") == 3, counts
    assert total(counts, lambda n: n == "custom") == 3, counts
    assert gateway.keys.keys, "the gateway learned no routing key"
    # The fleet view's gauges on /metrics, idle again: no request decoding.
    for series, count in zip(metrics, counts, strict=True):
        assert series['sglang_adaspec:slo_running_requests{slo_class="chat"}'] == 0
        if sum(count.values()):  # published once the server decoded
            assert series['sglang_adaspec:predicted_tpot_seconds{added="1"}'] > 0, series
