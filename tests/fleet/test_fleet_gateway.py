"""sglang-router 0.3.2 (the real binary) in front of stdlib workers that record what reaches
them: which request headers and body fields it forwards, that it ignores
`x-smg-target-worker` and keeps a routing key on one worker, and that the gateway
(`fleet/gateway.py`) pins requests to the server whose fleet view the rule prefers. No SGLang
server: the workers answer with canned bodies (seconds in all)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from sgl_adaspec.fleet.gateway import Gateway, serve
from sgl_adaspec.local_server.launch import free_port

REPLY = {
    "text": "x", "meta_info": {"id": "1", "finish_reason": {"type": "length"}},
    "id": "c", "object": "chat.completion", "created": 0, "model": "default",
    "choices": [{"index": 0, "text": "x", "message": {"role": "assistant", "content": "x"},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}  # fmt: skip
GETS = {
    "/v1/models": {"object": "list", "data": [{"id": "default", "object": "model"}]},
    "/get_model_info": {"model_path": "default", "is_generation": True},
    "/get_server_info": {"model_path": "default", "dp_size": 1},
    "/server_info": {"model_path": "default", "dp_size": 1},
}


class Worker:
    """A worker the router accepts: records each POST (path, headers, JSON body), lists the
    routing keys it was sent as a plugin server does, and serves `view` as its fleet view."""

    def __init__(self) -> None:
        self.received: list[dict] = []
        self.keys: dict[str, float] = {}
        self.view: dict | None = None
        worker = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def reply(self, body) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/adaspec/slo_load":
                    now = time.monotonic()
                    keys = {k: now - seen for k, seen in worker.keys.items()}
                    return self.reply({"replicas": [worker.view], "routing_keys": keys})
                self.reply(GETS.get(self.path.split("?")[0], {}))

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                if "x-smg-routing-key" in headers:
                    worker.keys[headers["x-smg-routing-key"]] = time.monotonic()
                parsed = json.loads(body or b"null")
                worker.received.append({"path": self.path, "headers": headers, "body": parsed})
                if isinstance(parsed, dict) and parsed.get("stream"):
                    return self.stream()
                self.reply(REPLY)

            def stream(self) -> None:
                """Two SSE events in HTTP chunks, a pause between them."""
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                for event in (b'data: {"text": "a"}\n\n', b"data: [DONE]\n\n"):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                    self.wfile.flush()
                    time.sleep(0.2)
                self.wfile.write(b"0\r\n\r\n")

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Two workers behind one router (`--policy manual --assignment-mode min_group`), shared by
    the module: the router takes seconds to start."""
    pair = [Worker(), Worker()]
    log = tmp_path_factory.mktemp("router") / "router.log"
    process, url = start_router(
        [w.url for w in pair], log, "--policy", "manual", "--assignment-mode", "min_group"
    )
    yield pair, url
    process.kill()
    process.wait()
    for worker in pair:
        worker.close()


@pytest.fixture
def workers(fleet):
    for worker in fleet[0]:
        worker.received.clear()
    return fleet[0]


@pytest.fixture
def router(fleet):
    return fleet[1]


def start_router(urls: list[str], log_path, *flags: str):
    port = free_port()
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
             "--port", str(port), "--worker-urls", *urls, *flags],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            ready = requests.get(f"{url}/readiness", timeout=1).json()
            if ready.get("healthy_workers") == len(urls):
                return process, url
        except (requests.RequestException, ValueError):
            pass
        time.sleep(0.2)
    process.kill()
    raise TimeoutError(f"sglang-router not ready in 120 s: {log_path.read_text()[-3000:]}")


BODIES = {
    "/generate": {"text": "hi", "sampling_params": {"max_new_tokens": 2,
                                                    "custom_params": {"slo_class": "chat"}}},
    "/v1/chat/completions": {"model": "default", "messages": [{"role": "user", "content": "hi"}],
                             "custom_params": {"slo_class": "chat"},
                             "metadata": {"slo_class": "chat"}},
    "/v1/completions": {"model": "default", "prompt": "hi", "custom_params": {"slo_class": "chat"},
                        "metadata": {"slo_class": "chat"}},
}  # fmt: skip
SENT_HEADERS = {
    "x-slo-class": "chat", "x-slo-tpot-ms": "50", "x-request-id": "r1",
    "x-request-id-slo-class": "chat", "x-request-id-slo-tpot-ms": "50",
    "x-correlation-id": "c1", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "tracestate": "a=b", "x-smg-routing-key": "k1", "authorization": "Bearer t",
    "x-custom-labels": "a=b", "x-trace-id": "t1", "request-id": "r2", "x-foo": "bar",
    "user-agent": "test",
}  # fmt: skip
# What sglang-router 0.3.2 forwarded of SENT_HEADERS, on each of the three endpoints.
FORWARDED = {
    "x-request-id", "x-request-id-slo-class", "x-request-id-slo-tpot-ms", "x-correlation-id",
    "traceparent", "tracestate", "x-smg-routing-key", "authorization",
}  # fmt: skip


def test_what_sglang_router_forwards(workers, router):
    for path, body in BODIES.items():
        assert requests.post(router + path, json=body, headers=SENT_HEADERS, timeout=10).ok
    received = {r["path"]: r for w in workers for r in w.received}
    for path in BODIES:
        assert set(received[path]["headers"]) & set(SENT_HEADERS) == FORWARDED, path
    generate, chat, completions = (received[path]["body"] for path in BODIES)
    assert "custom_params" not in generate["sampling_params"] and "custom_params" not in generate
    assert "custom_params" not in chat and chat["metadata"] == {"slo_class": "chat"}
    assert completions["custom_params"] == completions["metadata"] == {"slo_class": "chat"}


def landed(workers, url: str, count: int, headers: dict) -> list[int]:
    """The worker index of each of `count` /generate requests sent to `url`."""
    for worker in workers:
        worker.received.clear()
    for _ in range(count):
        response = requests.post(f"{url}/generate", json=BODIES["/generate"], headers=headers)
        response.raise_for_status()
    return [i for i, w in enumerate(workers) for _ in w.received]


def test_the_router_ignores_target_worker_and_keeps_a_routing_key_on_one_worker(workers, router):
    # 16 requests "pinned" to worker 1: both got some (the manual policy's random placement;
    # the chance that all 16 land on one is 2 ** -15).
    assert set(landed(workers, router, 16, {"x-smg-target-worker": "1"})) == {0, 1}
    assert len(set(landed(workers, router, 8, {"x-smg-routing-key": "session-a"}))) == 1


def view(margin_slo_ms: float) -> dict:
    """A worker decoding 4 requests of one class at `margin_slo_ms`, 21 ms a token with a fifth."""
    return {
        "running": 4, "waiting": 0, "tpot_ms_by_requests": [10, 12, 15, 18, 21, 25],
        "classes": {"chat": {"requests": 4, "tpot_slo_ms": margin_slo_ms}},
        "slo_classes_ms": {"chat": 50.0},
    }  # fmt: skip


def test_the_gateway_pins_each_request_to_the_server_its_rule_prefers(workers, router):
    gateway = Gateway(router, [w.url for w in workers], poll_interval_s=0.05)
    server = serve(gateway, "127.0.0.1", free_port())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        workers[0].view, workers[1].view = view(20.0), view(100.0)  # 0 misses with a fifth
        for preferred in (1, 0):
            # Until the gateway learned a key that reaches it, a request goes where the router
            # puts a new key (min_group: the worker with the fewest keys).
            deadline = time.monotonic() + 20
            while preferred not in gateway.keys.keys and time.monotonic() < deadline:
                requests.post(f"{url}/generate", json=BODIES["/generate"], timeout=10)
                time.sleep(0.2)
            for worker in workers:
                worker.received.clear()
            for path, body in BODIES.items():
                for _ in range(3):
                    requests.post(url + path, json=body, timeout=10).raise_for_status()
            assert [len(w.received) for w in workers][preferred] == 9, preferred
            generate = [r for r in workers[preferred].received if r["path"] == "/generate"]
            # /generate's SLO crossed the router in the header the gateway added.
            assert all(r["headers"]["x-request-id-slo-class"] == "chat" for r in generate)
            workers[0].view, workers[1].view = view(100.0), view(20.0)  # now 1 misses
            time.sleep(0.3)  # the gateway's next views
        # A stream passes through event by event.
        body = {**BODIES["/generate"], "stream": True}
        with requests.post(f"{url}/generate", json=body, stream=True, timeout=10) as response:
            events = [line for line in response.iter_lines() if line]
        assert events == [b'data: {"text": "a"}', b"data: [DONE]"]
    finally:
        gateway.stopped.set()
        server.shutdown()
        server.server_close()
