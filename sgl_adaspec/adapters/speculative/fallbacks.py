"""Where the plugin stops deciding and SGLang's own behaviour stands in: counted, visible,
and an error under the strict switch.

Every fallback is lossless (the full tree is verified, the exit skipped, the policy runs without
a profile or tiers), so a crash there would pass every greedy-equality test unseen. Each one is
counted by reason (`/server_info`'s `adaspec.fallbacks`, `/metrics`'s
`sglang_adaspec:fallbacks_total{reason}`) and logged once per reason with its count. With
`ADASPEC_STRICT=1` (the test suite sets it) a fallback raises instead, so the first one fails
the test that met it. `ADASPEC_FAULT_EVERY=N` (tests only) makes the policy's every N-th
decision raise, to show that both work.
"""

from __future__ import annotations

import enum
import logging
import os
from collections import Counter

logger = logging.getLogger(__name__)

STRICT_ENV = "ADASPEC_STRICT"
FAULT_EVERY_ENV = "ADASPEC_FAULT_EVERY"


class Fallback(enum.StrEnum):
    DECISION = "decision"  # the policy raised: the full tree is verified
    EARLY_EXIT = "early_exit"  # the verify's early exit raised: verified in full
    COST_PROFILE = "cost_profile"  # the verify cost profile raised: policies run without it
    TIER_BUILD = "tier_build"  # building the draft tiers raised: the configured search runs
    REPLICA_REPORT = "replica_report"  # no DP report in a load snapshot: older reports stand
    SLO_LOAD = "slo_load"  # the fleet view's gauges were not updated: older values stand


class FallbackError(RuntimeError):
    """A fallback under `ADASPEC_STRICT=1`."""


class InjectedFault(RuntimeError):
    """The policy's decision that `ADASPEC_FAULT_EVERY` makes fail."""


_COUNTS: Counter[str] = Counter()
_METRIC = None


def strict() -> bool:
    value = os.environ.get(STRICT_ENV, "0")
    if value not in ("0", "1"):
        raise ValueError(f"{STRICT_ENV} must be 0 or 1, got {value!r}")
    return value == "1"


def fell_back(reason: Fallback, exc: BaseException) -> None:
    """Called in the `except` block of a fallback: count it, log it (the first time with its
    traceback, then at each power of ten), or raise under the strict switch."""
    if strict():
        raise FallbackError(f"sgl_adaspec: {reason} fallback under {STRICT_ENV}=1: {exc!r}") from exc
    _COUNTS[reason] += 1
    count = _COUNTS[reason]
    if _METRIC is not None:
        _METRIC.labels(str(reason)).inc()
    if count == 1:
        logger.exception("sgl_adaspec: %s fallback (first of its kind)", reason)
    elif _is_power_of_ten(count):
        logger.warning("sgl_adaspec: %s fallback, %d so far; last: %r", reason, count, exc)


def counts() -> dict[str, int]:
    """Fallbacks of this process by reason, every reason listed."""
    return {str(reason): _COUNTS[reason] for reason in Fallback}


def export_metrics() -> None:
    """`sglang_adaspec:fallbacks_total{reason}` on `/metrics`, every reason from 0."""
    global _METRIC
    if _METRIC is not None:
        return
    from prometheus_client import Counter as PromCounter

    from sgl_adaspec.speculative.metrics import PREFIX

    _METRIC = PromCounter(
        f"{PREFIX}fallbacks", "Times the plugin fell back to SGLang's behaviour", ["reason"]
    )
    for reason in Fallback:
        _METRIC.labels(str(reason)).inc(_COUNTS[reason])


def inject_faults(policy) -> None:
    """Under `ADASPEC_FAULT_EVERY=N`, every N-th `policy.decide` raises `InjectedFault`."""
    every = int(os.environ.get(FAULT_EVERY_ENV, "0") or 0)
    if every <= 0:
        return
    decide, calls = policy.decide, [0]

    def faulty_decide(it):
        calls[0] += 1
        if calls[0] % every == 0:
            raise InjectedFault(f"decision {calls[0]} fails ({FAULT_EVERY_ENV}={every})")
        return decide(it)

    policy.decide = faulty_decide
    logger.warning("sgl_adaspec: every %d-th decision raises (%s)", every, FAULT_EVERY_ENV)


def _is_power_of_ten(n: int) -> bool:
    while n % 10 == 0 and n > 1:
        n //= 10
    return n == 1
