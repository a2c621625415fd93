"""Per-request bookkeeping on SGLang's `Req`: the SLO clock attached at a request's first
decode iteration (`_adaspec_state`) and started at its first token, the batch's SLO state for
the policy, the finished request's report to the statistics, and the verified-token counts its
response carries."""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import torch

from sgl_adaspec.adapters import fleet_view
from sgl_adaspec.adapters.scheduler import request_slo
from sgl_adaspec.adapters.speculative.blind_prefill import draft_blind
from sgl_adaspec.adapters.speculative.runtime import (
    forget_request,
    from_perf_counter,
    now_s,
    replica_reporter,
)
from sgl_adaspec.scheduler.request_slo import RequestSlo
from sgl_adaspec.scheduler.slo import SloBatch
from sgl_adaspec.speculative.metrics import VERIFIED_TOKENS_KEY
from sgl_adaspec.speculative.policies.base import PolicyBase


@dataclass
class RequestState:
    """Per-request SLO bookkeeping, attached to SGLang's Req (it lives as long as the request).
    `policy` is the process's policy: the request reports itself to its statistics when it
    finishes, and the policy forgets its per-request state. first_token_s: when its first token
    came (the plugin's clock); tokens_at_start: its output tokens then, so its TPOT is the time
    since over the tokens since, as a client and SGLang's own metrics measure it; committed:
    the tokens its decode iterations committed since (bonus tokens included)."""

    slo: RequestSlo
    first_token_s: float
    tokens_at_start: int
    policy: PolicyBase
    reported: bool = False
    # Set once its SLO was found unreachable even alone; it is then served best effort.
    infeasible: bool = False
    committed: int = 0

    @property
    def stats(self):
        return self.policy.stats

    def tokens_decoded(self, output_len: int) -> int:
        """Tokens since its first token, as of the iteration about to run. On SGLang's overlap
        schedule (CUDA's default, and the CPU's) an iteration runs before the previous one's
        tokens reach `req.output_ids`: the count the iterations committed is then ahead of
        the output, and it is the one the request's SLO state must read."""
        return max(output_len - self.tokens_at_start, self.committed)

    def tpot_ms(self, tokens_out: int, now_s: float) -> float | None:
        decoded = tokens_out - self.tokens_at_start
        return 1000 * (now_s - self.first_token_s) / decoded if decoded > 0 else None


# The requests decoding now, by id, for the fleet view (`adapters/fleet_view.py`); weak, so a
# request SGLang drops without finishing it leaves no entry.
_OPEN: weakref.WeakValueDictionary[str, RequestState] = weakref.WeakValueDictionary()


def open_states() -> list[RequestState]:
    """The SLO state of every request decoding now (its clock attached, not finished)."""
    return list(_OPEN.values())


def track_requests(reqs, policy: PolicyBase) -> None:
    """Attach SLO bookkeeping to requests decoding for the first time, in every decode
    iteration, speculative or plain, so one served without speculation still reports its TPOT
    when it finishes. A request's clock starts at its first token (`first_token_s`): prefills
    run before decode iterations, and one that waited for other requests' prefills before its
    first decode iteration is that much behind its SLO, as its client measures it."""
    now = now_s()
    reporter = replica_reporter()
    for req in reqs:
        if getattr(req, "_adaspec_state", None) is None:
            slo = request_slo(req)
            start = first_token_s(req, now)
            # At least the prefill's token: on the overlap schedule a request's first decode
            # iteration runs before that token reaches its output.
            tokens = max(len(req.output_ids), 1)
            req._adaspec_state = _OPEN[req.rid] = RequestState(slo, start, tokens, policy)
            policy.stats.open_requests += 1
            if reporter is not None:
                reporter.track(req.rid, slo.resolve_ms(policy.baseline_tpot_ms()))


def first_token_s(req, now: float) -> float:
    """When `req`'s first token came on the plugin's clock: the end of its prefill as SGLang
    stamps it (`time_stats.prefill_finished_time`, perf_counter), or `now` where SGLang left no
    stamp (0: a request whose prefill ran on another node) or one later than `now`."""
    stamp = getattr(getattr(req, "time_stats", None), "prefill_finished_time", 0.0)
    if not isinstance(stamp, (int, float)) or not stamp > 0:
        return now
    return min(from_perf_counter(stamp), now)


def slo_batch(reqs, policy: PolicyBase, baseline_tpot_ms: float | None) -> SloBatch:
    """The running requests' SLO state (see `track_requests`). Classes relative to the
    baseline TPOT resolve with `baseline_tpot_ms` (best effort while it is unknown)."""
    track_requests(reqs, policy)
    now = now_s()
    tpot, elapsed, tokens = [], [], []
    for req in reqs:
        state = req._adaspec_state
        target_ms = state.slo.resolve_ms(baseline_tpot_ms)
        tpot.append(target_ms if target_ms is not None else math.nan)
        elapsed.append(1000 * (now - state.first_token_s))
        tokens.append(state.tokens_decoded(len(req.output_ids)))
    return SloBatch(
        tpot_slo_ms=torch.tensor(tpot, dtype=torch.float64),
        decode_elapsed_ms=torch.tensor(elapsed, dtype=torch.float64),
        tokens_out=torch.tensor(tokens, dtype=torch.float64),
        draft_blind=draft_blind(reqs),
    )


def request_finished(_result, req, *args, **kwargs) -> None:
    """AFTER `Req.update_finish_state`: a finished request reports its TPOT against its SLO."""
    state = getattr(req, "_adaspec_state", None)
    if state is None or state.reported or not req.finished():
        return
    state.reported = True
    state.stats.open_requests -= 1
    forget_request(state.policy, req.rid)
    _OPEN.pop(req.rid, None)
    reporter = replica_reporter()
    if reporter is not None:
        reporter.finish(req.rid)
    # At once when the last request left: the gauges must not show a load that is gone.
    fleet_view.publish(state.policy, now_s(), force=not _OPEN)
    tpot_ms = state.tpot_ms(len(req.output_ids), now_s())
    if tpot_ms is not None:
        target_ms = state.slo.resolve_ms(state.stats.baseline_tpot_ms)
        state.stats.observe_finished(state.slo.slo_class, tpot_ms, target_ms, state.infeasible)


def record_committed(reqs, committed: torch.Tensor | int) -> None:
    """committed [B]: tokens each request committed this decode iteration (bonus included);
    an int: as many for every request (a plain iteration's 1, read without a device sync)."""
    counts = committed.tolist() if isinstance(committed, torch.Tensor) else [committed] * len(reqs)
    for req, tokens in zip(reqs, counts):
        state = getattr(req, "_adaspec_state", None)
        if state is not None:
            state.committed += int(tokens)


def record_verified(reqs, verified: torch.Tensor, committed: torch.Tensor) -> None:
    """verified [B]: tokens each request sent to the target this speculative iteration (root
    included); committed [B]: tokens it committed (bonus included) -> each request's
    `customized_info[VERIFIED_TOKENS_KEY]`, token-aligned as SGLang slices customized info by
    output token (streamed chunks carry [sent, output length) of it): the iteration's verified
    count at its first committed token, None at its other tokens and at every token no
    speculative iteration committed (the prefill's, plain iterations'). A list of one entry
    per iteration, as SGLang's `customized_info` of the logits output makes, reached only
    non-streamed responses: by token offsets a stream's later chunks sliced past its end.
    The count's place is the request's output length before this iteration (padded up to it
    with None); on SGLang's overlap schedule, where the output lags one iteration, only a
    request's first count may sit early."""
    for req, count, tokens in zip(reqs, verified.tolist(), committed.tolist()):
        if req.customized_info is None:
            req.customized_info = {}
        entries = req.customized_info.setdefault(VERIFIED_TOKENS_KEY, [])
        entries.extend([None] * (len(req.output_ids) - len(entries)))
        entries.append(int(count))
        entries.extend([None] * (int(tokens) - 1))
