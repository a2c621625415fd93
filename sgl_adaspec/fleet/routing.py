"""SLO-aware routing across plugin servers behind sglang-router: the gateway's pure logic
(`gateway.py` is its HTTP proxy).

sglang-router 0.3.2 cannot be told which worker to use: it ignores `x-smg-target-worker`
(measured; docs/parallel.md). Its `manual` policy keeps each `x-smg-routing-key` on one worker
(a new key goes where `--assignment-mode` puts it), and it forwards that header to the worker.
Each plugin server lists the routing keys it was sent lately in its fleet view
(`GET /adaspec/slo_load`), so the gateway learns which of its keys reaches which server
(`KeyBook`), and pins a request to a server by sending that server's key.

Which server: the same rule as the SLO-aware DP dispatch (`dp_dispatch.choose_replica`), over
every replica of every server, on the servers' views (`slo_load.replica_load`) plus what the
gateway itself sent since it last read them.
"""

from __future__ import annotations

import itertools
import math
import uuid
from dataclasses import dataclass, field

from sgl_adaspec.scheduler.dp_dispatch import ReplicaLoad, choose_replica
from sgl_adaspec.scheduler.request_slo import (
    CLASS_FIELD,
    ROUTER_SLO_HEADERS,
    SLO_HEADERS,
    TPOT_FIELD,
    TTFT_FIELD,
    slo_params_of_metadata,
)
from sgl_adaspec.scheduler.slo_load import replica_load

ROUTING_KEY_HEADER = "x-smg-routing-key"
GENERATE = "/generate"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
ROUTED_PATHS = (GENERATE, CHAT, COMPLETIONS)
_ROUTER_NAME = {field: header for header, field in ROUTER_SLO_HEADERS.items()}


def body_slo_params(path: str, body) -> tuple[dict | None, bool]:
    """The SLO fields a request's body states, where the plugin reads them: `custom_params`
    (in `sampling_params` on /generate, the first prompt's for a batch), else OpenAI's
    `metadata` on the OpenAI-compatible endpoints; and whether sglang-router 0.3.2 forwards
    them (it drops `custom_params` on /generate and chat)."""
    if not isinstance(body, dict):
        return None, True
    crosses = True
    if path == GENERATE:
        sampling = body.get("sampling_params")
        sampling = sampling[0] if isinstance(sampling, list) and sampling else sampling
        params = sampling.get("custom_params") if isinstance(sampling, dict) else None
        crosses = False
    else:
        params = body.get("custom_params")
        if params is not None:
            crosses = path != CHAT
        else:
            params = slo_params_of_metadata(body.get("metadata"))
    if not isinstance(params, dict):
        return None, True
    fields = {k: v for k, v in params.items() if k in (TPOT_FIELD, CLASS_FIELD, TTFT_FIELD)}
    return fields or None, crosses


def header_slo_params(headers) -> dict | None:
    """The SLO fields of a request's headers, either name (values as text)."""
    params = {}
    for header, field_name in {**SLO_HEADERS, **ROUTER_SLO_HEADERS}.items():
        value = headers.get(header)
        if value is not None:
            params.setdefault(field_name, value)
    return params or None


def request_slo(path: str, body, headers) -> tuple[dict | None, dict[str, str]]:
    """A request's SLO fields (its body's, which a server reads first, else its headers') and
    the headers that carry them across the router where it would drop them."""
    params, crosses = body_slo_params(path, body)
    if params is not None:
        return params, {} if crosses else crossing_headers(params)
    params = header_slo_params(headers)
    return params, crossing_headers(params)


def request_slo_ms(params: dict | None, classes_ms: dict[str, float | None]) -> float | None:
    """The request's TPOT SLO in ms from its SLO fields (the body's, else the headers'); a
    class resolved with the servers' `slo_classes_ms`. None: best effort, unknown, or a value
    the server will refuse (with a 400 of its own)."""
    if not params:
        return None
    if TPOT_FIELD in params:
        try:
            ms = float(params[TPOT_FIELD])
        except (TypeError, ValueError):
            return None
        return ms if math.isfinite(ms) and ms > 0 else None
    name = params.get(CLASS_FIELD)
    return classes_ms.get(name) if isinstance(name, str) else None


def crossing_headers(params: dict | None) -> dict[str, str]:
    """SLO fields under the header names sglang-router forwards (`x-request-id-slo-*`)."""
    return {_ROUTER_NAME[k]: _text(v) for k, v in (params or {}).items() if k in _ROUTER_NAME}


def _text(value) -> str:
    return format(value, "g") if isinstance(value, float) else str(value)


@dataclass
class KeyBook:
    """Routing keys of this gateway and the server each was last seen on.
    `keys[server]`: a key the router sends to that server (the one seen there most recently)."""

    prefix: str = field(default_factory=lambda: f"adaspec-{uuid.uuid4().hex[:8]}")
    keys: dict[int, str] = field(default_factory=dict)
    _counter: itertools.count = field(default_factory=itertools.count)

    def key_for(self, server: int | None) -> str:
        """`server`'s key; a fresh key (placed by the router) while none is known for it."""
        if server is not None and server in self.keys:
            return self.keys[server]
        return f"{self.prefix}-{next(self._counter)}"

    def learn(self, seen: dict[int, dict[str, float]]) -> None:
        """`seen[server]`: the keys that server lists, seconds since each was sent there. A key
        belongs to the server that saw it last (the router moves keys off unhealthy workers)."""
        latest: dict[str, tuple[float, int]] = {}
        for server, ages in seen.items():
            for key, age in ages.items():
                if key.startswith(f"{self.prefix}-") and (
                    key not in latest or age < latest[key][0]
                ):
                    latest[key] = (age, server)
        best: dict[int, tuple[float, str]] = {}
        for key, (age, server) in latest.items():
            if server not in best or age < best[server][0]:
                best[server] = (age, key)
        self.keys = {server: key for server, (_, key) in best.items()}


@dataclass
class Fleet:
    """The servers' last views (None: not read) and what was sent to each replica since."""

    views: list[list[dict] | None]
    sent: dict[tuple[int, int], list[float | None]] = field(default_factory=dict)

    def update(self, views: list[list[dict] | None]) -> None:
        self.views, self.sent = views, {}

    def classes_ms(self) -> dict[str, float | None]:
        """The SLO classes in ms, as the servers resolve them (the first server that knows)."""
        classes: dict[str, float | None] = {}
        for replicas in self.views:
            for view in replicas or ():
                for name, ms in (view.get("slo_classes_ms") or {}).items():
                    if classes.get(name) is None:
                        classes[name] = ms
        return classes

    def choose(self, slo_ms: float | None) -> int | None:
        """The server for a request of TPOT SLO `slo_ms`; None: no view read yet. Counts it
        on the chosen replica until the next views."""
        places, loads = [], []
        for server, replicas in enumerate(self.views):
            for replica, view in enumerate(replicas or ()):
                if view is None:
                    continue
                load: ReplicaLoad = replica_load(view)
                for slo in self.sent.get((server, replica), ()):
                    load = load.admit(slo)
                places.append((server, replica))
                loads.append(load)
        if not loads:
            return None
        place = places[choose_replica(loads, slo_ms)]
        self.sent.setdefault(place, []).append(slo_ms)
        return place[0]
