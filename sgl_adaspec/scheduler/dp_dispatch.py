"""SLO-aware dispatch across data-parallel replicas (`--slo-dispatch on`): which replica a new
request goes to. Pure logic; the SGLang adapter is `adapters/dp.py`.

A replica's TPOT grows with the requests it serves. A new request is best placed where its own
TPOT SLO holds with it added, and where the requests already there keep theirs. The rule scores
each replica by its margin: the tightest TPOT SLO that would be in force there (the new
request's, if it has one, and those of the requests already there), less the replica's
per-token time with one more request.
- Among the replicas where every SLO in force holds with the request added (margin >= 0), the
  fastest: the lowest per-token time with one more request, then the fewest requests. Where
  per-token time hardly grows with the batch (a GPU below its knee) that is the fewest
  requests, as SGLang's `total_requests`; SLOs only rule out replicas.
- Where no replica can take it without a miss, the least harm: the largest margin.
- A replica that cannot meet the request's SLO even serving it alone is not offered it while
  another can. SLOs relative to the baseline TPOT resolve against each replica's own baseline
  (replicas on unlike hardware have unlike baselines), so the target may differ by replica.
The first form of the rule sent every request to the largest margin; in the simulator that
piled the looser classes onto the replicas without tight requests (4 replicas of a100x4-llama70b
at 8 req/s each: chat 0.83 against 0.96 with `total_requests`). See docs/parallel.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sgl_adaspec.scheduler.request_slo import RequestSlo


@dataclass(frozen=True)
class ReplicaLoad:
    """One replica as the dispatcher sees it:
    - requests: requests in flight there (running and waiting);
    - slos_ms: the TPOT SLOs (ms per token) of those that have one and can still meet it;
    - tpot_ms_by_requests: its per-token time with k + 1 requests at index k (the replica's
      own latency model); empty while unknown."""

    requests: int
    slos_ms: tuple[float, ...] = ()
    tpot_ms_by_requests: tuple[float, ...] = ()

    def tpot_ms(self, requests: int) -> float | None:
        """Per-token time with `requests` requests (the last point past the curve's end)."""
        curve = self.tpot_ms_by_requests
        if not curve or requests < 1:
            return None
        return curve[min(requests, len(curve)) - 1]

    def admit(self, slo_ms: float | None) -> ReplicaLoad:
        """This replica with one more request of that SLO: the dispatcher's own count until
        the replica's next report."""
        slos = self.slos_ms if slo_ms is None else (*self.slos_ms, slo_ms)
        return ReplicaLoad(self.requests + 1, slos, self.tpot_ms_by_requests)


def margin_ms(replica: ReplicaLoad, slo_ms: float | None) -> float | None:
    """The tightest TPOT SLO in force on `replica` with the new request added, less its
    per-token time then (inf where no SLO is in force; None: the time is unknown)."""
    tpot = replica.tpot_ms(replica.requests + 1)
    if tpot is None:
        return None
    slos = replica.slos_ms if slo_ms is None else (*replica.slos_ms, slo_ms)
    return (min(slos) if slos else math.inf) - tpot


def targets_ms(slo: RequestSlo | None, baselines_ms: Sequence[float | None]) -> list:
    """The request's TPOT SLO on each replica (None: best effort there, or a relative class
    while that replica's baseline is unknown), from the replicas' baselines."""
    if slo is None:
        return [None] * len(baselines_ms)
    targets = [slo.resolve_ms(baseline) for baseline in baselines_ms]
    return [t if t is not None and math.isfinite(t) else None for t in targets]


def choose_replica(
    replicas: Sequence[ReplicaLoad], slo_ms: float | None | Sequence[float | None]
) -> int:
    """Index of the replica for a new request with TPOT SLO `slo_ms` (None: best effort), one
    for every replica or one per replica (`targets_ms`). Without every replica's per-token time
    it falls back to the fewest requests in flight."""
    if not replicas:
        raise ValueError("no replica to dispatch to")
    targets = list(slo_ms) if isinstance(slo_ms, Sequence) else [slo_ms] * len(replicas)
    margins = [margin_ms(replica, target) for replica, target in zip(replicas, targets)]
    if any(margin is None for margin in margins):
        return min(range(len(replicas)), key=lambda i: replicas[i].requests)

    def speed(i: int) -> tuple[float, int]:
        return replicas[i].tpot_ms(replicas[i].requests + 1), replicas[i].requests

    able = [
        i for i, target in enumerate(targets) if target is None or replicas[i].tpot_ms(1) <= target
    ]
    candidates = able or range(len(replicas))
    harmless = [i for i in candidates if margins[i] >= 0]
    if harmless:
        return min(harmless, key=speed)
    return min(candidates, key=lambda i: (-margins[i], *speed(i)))
