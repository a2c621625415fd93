"""A server's SLO load as a gateway in front of several servers reads it: the fleet view
(`GET /adaspec/slo_load`, one view per data-parallel replica, and the `sglang_adaspec:slo_*`
gauges). Pure logic; the SGLang adapter is `adapters/fleet_view.py`.

A view holds:
- per SLO class, labelled as the plugin's Prometheus series are (`metrics.prometheus_slo_label`:
  a bare `tpot_slo_ms` is `custom_le_<edge>ms`): the requests decoding now, the tightest TPOT
  SLO among them, their mean and worst TPOT so far, and how many are behind their SLO;
- the server's per-token time with k requests decoding (`tpot_ms_by_requests`, the policy's
  latency fit, as the DP replicas' reports give it) and with 1, 2, ... more requests than it
  holds now (`tpot_ms_added`);
- its margin for one more request without an SLO: the tightest SLO in force less its per-token
  time then (`dp_dispatch.margin_ms`; null where no SLO is in force or the time is unknown);
- the server's classes resolved in ms (`slo_classes_ms`), so a gateway can price a request
  that names a class.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from sgl_adaspec.scheduler.dp_dispatch import ReplicaLoad, margin_ms

# Points of `tpot_ms_added`: the per-token time with 1..ADDED_POINTS more requests.
ADDED_POINTS = 8


@dataclass(frozen=True)
class OpenRequest:
    """A request decoding on the server: its class label, its TPOT SLO in ms (None: best
    effort, or a relative class while the baseline is unknown), the time since its first token
    and the tokens it decoded since."""

    label: str
    tpot_slo_ms: float | None
    decode_elapsed_ms: float
    tokens_out: int

    @property
    def tpot_now_ms(self) -> float | None:
        return self.decode_elapsed_ms / self.tokens_out if self.tokens_out > 0 else None


def _ms(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 3)


def class_load(requests: list[OpenRequest]) -> dict:
    """One class's entry of the view."""
    slos = [r.tpot_slo_ms for r in requests if r.tpot_slo_ms is not None]
    tpots = [(r.tpot_now_ms, r.tpot_slo_ms) for r in requests if r.tpot_now_ms is not None]
    return {
        "requests": len(requests),
        "tpot_slo_ms": _ms(min(slos)) if slos else None,
        "tpot_now_ms": _ms(sum(t for t, _ in tpots) / len(tpots)) if tpots else None,
        "tpot_now_max_ms": _ms(max(t for t, _ in tpots)) if tpots else None,
        "behind": sum(1 for t, slo in tpots if slo is not None and t > slo),
    }


def slo_load(
    requests: Iterable[OpenRequest],
    tpot_ms_by_requests: Iterable[float],
    *,
    running: int | None = None,
    waiting: int | None = None,
    baseline_tpot_ms: float | None = None,
    slo_classes_ms: dict[str, float | None] | None = None,
    added: int = ADDED_POINTS,
) -> dict:
    """The view of one scheduler. `running`: SGLang's count of running requests where known
    (else the requests given); `waiting`: its queue, counted in the load where given."""
    requests = list(requests)
    curve = [float(ms) for ms in tpot_ms_by_requests]
    by_label: dict[str, list[OpenRequest]] = {}
    for request in requests:
        by_label.setdefault(request.label, []).append(request)
    classes = {label: class_load(group) for label, group in sorted(by_label.items())}
    slos = tuple(c["tpot_slo_ms"] for c in classes.values() if c["tpot_slo_ms"] is not None)
    running = len(requests) if running is None else running
    load = ReplicaLoad(running + (waiting or 0), slos, tuple(curve))
    after = [load.tpot_ms(load.requests + k) for k in range(1, added + 1)] if curve else []
    return {
        "running": running,
        "waiting": waiting,
        "classes": classes,
        "tightest_slo_ms": min(slos) if slos else None,
        "margin_ms": _ms(margin_ms(load, None)),
        "tpot_ms_added": [_ms(ms) for ms in after],
        "tpot_ms_by_requests": [_ms(ms) for ms in curve],
        "baseline_tpot_ms": _ms(baseline_tpot_ms),
        "slo_classes_ms": {k: _ms(v) for k, v in (slo_classes_ms or {}).items()},
    }


def replica_load(view: dict) -> ReplicaLoad:
    """A view as `dp_dispatch.choose_replica` reads a replica (only the tightest SLO of each
    class matters there: the margin takes the minimum)."""
    slos = tuple(c["tpot_slo_ms"] for c in view.get("classes", {}).values() if c.get("tpot_slo_ms"))
    requests = int(view.get("running") or 0) + int(view.get("waiting") or 0)
    curve = tuple(ms for ms in view.get("tpot_ms_by_requests") or () if ms is not None)
    return ReplicaLoad(requests, slos, curve)
