"""SGLang adapter of the fleet view (`scheduler/slo_load.py`): each server's SLO load, for a
gateway that routes across servers (`sgl_adaspec/fleet/gateway.py`).

- In each scheduler (TP rank 0 of each replica): the view is built from the requests decoding
  there (`request_state.open_states`) and the policy's latency fit (`dp.tpot_curve`, as the
  DP replicas' reports). It is mirrored into the `sglang_adaspec:slo_*` gauges at most every
  `PUBLISH_INTERVAL_S` from the decode loop, and at once when the last request leaves.
- In the HTTP process: `GET /adaspec/slo_load` asks the schedulers for it through SGLang's
  `get_internal_state` (the same round trip as `/server_info`, whose `adaspec.slo_load` it is)
  and lists the `x-smg-routing-key` values the server was sent lately: a gateway behind
  sglang-router's `manual` policy learns from them which key reaches which server.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict

from sgl_adaspec.adapters.dp import MAX_CURVE_REQUESTS, tpot_curve
from sgl_adaspec.adapters.speculative.fallbacks import Fallback, fell_back
from sgl_adaspec.scheduler.slo_load import OpenRequest, slo_load
from sgl_adaspec.speculative.metrics import prometheus_slo_label

ROUTE = "/adaspec/slo_load"
PUBLISH_INTERVAL_S = 1.0
ROUTING_KEY_HEADER = "x-smg-routing-key"
# Routing keys listed: the most recent ones, seen within ROUTING_KEY_TTL_S.
ROUTING_KEYS_KEPT = 256
ROUTING_KEY_TTL_S = 600.0

_last_publish_s = -math.inf
_routing_keys: OrderedDict[str, float] = OrderedDict()


def scheduler_view(policy, running: int | None = None, waiting: int | None = None) -> dict:
    """This scheduler's view (`slo_load.slo_load`); `policy` None: no SLO state (static)."""
    from sgl_adaspec.adapters.speculative import request_state
    from sgl_adaspec.adapters.speculative.runtime import now_s, runtime
    from sgl_adaspec.config import AdaspecConfig

    state = runtime()
    config = state.config if state is not None else AdaspecConfig.from_env()
    baseline = policy.baseline_tpot_ms() if policy is not None else None
    now = now_s()
    requests = []
    for open_state in request_state.open_states():
        target = open_state.slo.resolve_ms(baseline)
        label = prometheus_slo_label(open_state.slo.slo_class, target)
        # One found unreachable even alone is served best effort: no SLO in force.
        in_force = None if open_state.infeasible else target
        elapsed = 1000 * max(now - open_state.first_token_s, 0.0)
        requests.append(OpenRequest(label, in_force, elapsed, open_state.committed))
    classes = config.load_slo_config().classes
    return slo_load(
        requests,
        tpot_curve(policy, MAX_CURVE_REQUESTS) if policy is not None else (),
        running=running,
        waiting=waiting,
        baseline_tpot_ms=baseline,
        slo_classes_ms={name: c.resolve_ms(baseline) for name, c in classes.items()},
    )


def publish(policy, now_s: float, force: bool = False) -> None:
    """Mirror the view into the policy's metric sinks if due (`force`: now)."""
    global _last_publish_s
    if not policy.stats.sinks or (not force and now_s - _last_publish_s < PUBLISH_INTERVAL_S):
        return
    _last_publish_s = now_s
    try:
        policy.stats.observe_slo_load(scheduler_view(policy))
    except Exception as exc:  # a gauge left stale must not stop serving
        fell_back(Fallback.SLO_LOAD, exc)


def note_routing_key(headers) -> None:
    """In the HTTP process: remember the request's `x-smg-routing-key`, if any."""
    key = headers.get(ROUTING_KEY_HEADER)
    if not key:
        return
    _routing_keys[key] = time.monotonic()
    _routing_keys.move_to_end(key)
    while len(_routing_keys) > ROUTING_KEYS_KEPT:
        _routing_keys.popitem(last=False)


def recent_routing_keys(now: float | None = None) -> dict[str, float]:
    """The routing keys seen within `ROUTING_KEY_TTL_S`: seconds since each was last seen (a
    key the router moved to another server is seen there later)."""
    now = time.monotonic() if now is None else now
    ages = {key: round(now - seen, 3) for key, seen in _routing_keys.items()}
    return {key: age for key, age in ages.items() if age <= ROUTING_KEY_TTL_S}


async def fleet_view(tokenizer_manager) -> dict:
    """The body of `GET /adaspec/slo_load`: one view per data-parallel replica."""
    states = await tokenizer_manager.get_internal_state()
    return {
        "replicas": [(s.get("adaspec") or {}).get("slo_load") for s in states],
        "routing_keys": recent_routing_keys(),
    }


def add_routes(*args, **kwargs) -> None:
    """BEFORE `http_server._setup_and_run_http_server` (the HTTP process, before it serves):
    adds `GET /adaspec/slo_load` to SGLang's app."""
    from sglang.srt.entrypoints import http_server

    app = http_server.app
    if any(getattr(route, "path", None) == ROUTE for route in app.routes):
        return

    async def slo_load_endpoint():
        return await fleet_view(http_server.get_global_state().tokenizer_manager)

    app.add_api_route(ROUTE, slo_load_endpoint, methods=["GET"])
