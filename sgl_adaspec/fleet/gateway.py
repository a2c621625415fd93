"""An SLO-aware gateway in front of sglang-router (stdlib only): it reads each plugin server's
fleet view (`GET /adaspec/slo_load`) every `--poll-interval` seconds and pins each request on
/generate, /v1/chat/completions and /v1/completions to the server the SLO-aware rule picks
(`routing.Fleet.choose`), through the router's `manual` policy and a routing key the gateway
learned reaches that server (`routing.KeyBook`). It also moves each request's SLO into the
`x-request-id-slo-*` headers where the router would drop it. Everything else is passed on.

    python -m sglang_router.launch_router --worker-urls URL1 URL2 ... \\
        --policy manual --assignment-mode min_group --port 30000
    python -m sgl_adaspec.fleet.gateway --router http://127.0.0.1:30000 --port 30080

Clients then send to port 30080. Each response streams back as the router sends it (the
connection closes after it). See docs/parallel.md.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import threading
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sgl_adaspec.fleet.routing import (
    ROUTED_PATHS,
    ROUTING_KEY_HEADER,
    Fleet,
    KeyBook,
    request_slo,
    request_slo_ms,
)

logger = logging.getLogger("sgl_adaspec.gateway")
VIEW_PATH = "/adaspec/slo_load"
HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
    "transfer-encoding", "upgrade", "host", "content-length",
}  # fmt: skip


def read_json(url: str, timeout: float):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def router_workers(router_url: str) -> list[str]:
    """The worker URLs the router lists (`GET /workers`)."""
    return [w["url"] for w in read_json(f"{router_url}/workers", 10)["workers"]]


class Gateway:
    """The routing state: the servers' views and the key book, refreshed by `poll`."""

    def __init__(self, router_url: str, servers: list[str], poll_interval_s: float = 0.5):
        self.router = urllib.parse.urlsplit(router_url)
        self.servers = servers
        self.poll_interval_s = poll_interval_s
        self.fleet = Fleet([None] * len(servers))
        self.keys = KeyBook()
        self.lock = threading.Lock()
        self.stopped = threading.Event()

    def poll(self) -> None:
        """Read every server's view; a server that does not answer is left out until it does."""
        views, seen = [], {}
        for index, url in enumerate(self.servers):
            try:
                body = read_json(f"{url}{VIEW_PATH}", max(self.poll_interval_s * 4, 1.0))
            except (OSError, ValueError) as exc:
                logger.warning("no fleet view from %s: %s", url, exc)
                views.append(None)
                continue
            views.append([view for view in body.get("replicas") or () if view])
            seen[index] = body.get("routing_keys") or {}
        with self.lock:
            self.fleet.update(views)
            self.keys.learn(seen)

    def poll_forever(self) -> None:
        """Until `stopped` is set."""
        while not self.stopped.is_set():
            self.poll()
            self.stopped.wait(self.poll_interval_s)

    def route(self, path: str, body: bytes, headers) -> dict[str, str]:
        """Headers to add to a request: the chosen server's routing key and its SLO in the
        headers the router forwards. Nothing for paths the gateway does not route."""
        if urllib.parse.urlsplit(path).path not in ROUTED_PATHS:
            return {}
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = None  # the server answers it with its own 400
        params, extra = request_slo(urllib.parse.urlsplit(path).path, parsed, headers)
        with self.lock:
            slo_ms = request_slo_ms(params, self.fleet.classes_ms())
            server = self.fleet.choose(slo_ms)
            extra[ROUTING_KEY_HEADER] = self.keys.key_for(server)
        return extra


class Handler(BaseHTTPRequestHandler):
    gateway: Gateway  # set on the subclass `serve` makes

    def do_GET(self) -> None:
        self.forward()

    def do_POST(self) -> None:
        self.forward()

    def do_DELETE(self) -> None:
        self.forward()

    def forward(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        headers = {k: v for k, v in headers.items() if k.lower() != ROUTING_KEY_HEADER}
        headers.update(self.gateway.route(self.path, body, self.headers))
        router = self.gateway.router
        connection = http.client.HTTPConnection(router.hostname, router.port, timeout=3600)
        try:
            connection.request(self.command, self.path, body=body or None, headers=headers)
            response = connection.getresponse()
            self.send_response(response.status, response.reason)
            for name, value in response.getheaders():
                if name.lower() not in HOP_BY_HOP:
                    self.send_header(name, value)
            self.end_headers()  # HTTP/1.0: the body runs to the connection's close
            while chunk := response.read1(65536):
                self.wfile.write(chunk)
                self.wfile.flush()
        except OSError as exc:
            logger.warning("%s %s: %s", self.command, self.path, exc)
            self.close_connection = True
        finally:
            connection.close()

    def log_message(self, format, *args) -> None:
        logger.debug(format, *args)


def serve(gateway: Gateway, host: str, port: int) -> ThreadingHTTPServer:
    """The gateway's HTTP server (not yet serving) and its poller thread (started)."""
    handler = type("GatewayHandler", (Handler,), {"gateway": gateway})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=gateway.poll_forever, daemon=True, name="fleet-view").start()
    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--router", required=True, help="sglang-router's URL (--policy manual)")
    parser.add_argument(
        "--servers", nargs="*", help="the plugin servers' URLs (default: the router's workers)"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30080)
    parser.add_argument("--poll-interval", type=float, default=0.5, help="seconds between views")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    router = args.router.rstrip("/")
    servers = [url.rstrip("/") for url in args.servers or router_workers(router)]
    gateway = Gateway(router, servers, args.poll_interval)
    server = serve(gateway, args.host, args.port)
    logger.info("gateway on %s:%d -> %s, servers %s", args.host, args.port, router, servers)
    server.serve_forever()


if __name__ == "__main__":
    main()
