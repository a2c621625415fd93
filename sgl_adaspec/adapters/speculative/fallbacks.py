"""Where the plugin stops deciding and SGLang's own behaviour stands in: counted, visible,
and an error under the strict switch.

Every fallback is lossless (the full tree is verified, the exit skipped, the policy runs without
a profile or tiers), so a crash there would pass every greedy-equality test unseen. Each one is
counted by reason (`/server_info`'s `adaspec.fallbacks`, `/metrics`'s
`sglang_adaspec:fallbacks_total{reason}`) and logged once per reason with its count. With
`ADASPEC_STRICT=1` (the test suite sets it) a fallback raises instead, so the first one fails
the test that met it. `ADASPEC_FAULT_EVERY=N` (tests only) makes the policy's every N-th
decision raise, to show that both work; `ADASPEC_FAULT_IN` names the calls that raise
(default `decide`; `draft_shape` and `observe` as well).
"""

from __future__ import annotations

import enum
import logging
import os
from collections import Counter

logger = logging.getLogger(__name__)

STRICT_ENV = "ADASPEC_STRICT"
FAULT_EVERY_ENV = "ADASPEC_FAULT_EVERY"
FAULT_IN_ENV = "ADASPEC_FAULT_IN"
# The policy's calls a fault can be injected in: the plan's, the decision's, the outcome's.
FAULTY_CALLS = ("draft_shape", "decide", "observe")


class Fallback(enum.StrEnum):
    PLAN = "plan"  # the policy raised planning the draft (or taking an outcome then): the
    # configured search runs
    DECISION = "decision"  # the policy raised: the full tree is verified
    OBSERVE = "observe"  # the policy raised taking an outcome: that outcome is lost to it
    EARLY_EXIT = "early_exit"  # the verify's early exit raised: verified in full
    COST_PROFILE = "cost_profile"  # the verify cost profile raised: policies run without it
    TIER_BUILD = "tier_build"  # building the draft tiers raised: the configured search runs
    REPLICA_REPORT = "replica_report"  # no DP report in a load snapshot: older reports stand
    SLO_LOAD = "slo_load"  # the fleet view's gauges were not updated: older values stand


class FallbackError(RuntimeError):
    """A fallback under `ADASPEC_STRICT=1`."""


class InjectedFault(RuntimeError):
    """A policy call that `ADASPEC_FAULT_EVERY` makes fail."""


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
    """Under `ADASPEC_FAULT_EVERY=N`, every N-th call of each of `ADASPEC_FAULT_IN`'s
    (default `decide`) raises `InjectedFault`."""
    every = int(os.environ.get(FAULT_EVERY_ENV, "0") or 0)
    if every <= 0:
        return
    names = sorted({name.strip() for name in os.environ.get(FAULT_IN_ENV, "decide").split(",")})
    unknown = set(names) - set(FAULTY_CALLS)
    if unknown:
        raise ValueError(f"{FAULT_IN_ENV} names {sorted(unknown)}; calls: {FAULTY_CALLS}")
    for name in names:
        setattr(policy, name, _faulty(getattr(policy, name), name, every))
    logger.warning("sgl_adaspec: every %d-th call of %s raises (%s)", every, names, FAULT_EVERY_ENV)


def _faulty(call, name: str, every: int):
    calls = [0]

    def faulty(*args, **kwargs):
        calls[0] += 1
        if calls[0] % every == 0:
            raise InjectedFault(f"{name} call {calls[0]} fails ({FAULT_EVERY_ENV}={every})")
        return call(*args, **kwargs)

    return faulty


def _is_power_of_ten(n: int) -> bool:
    while n % 10 == 0 and n > 1:
        n //= 10
    return n == 1
