"""What a policy measures of the iterations it runs, to price its next choices: the smoothed
latencies, the verify / draft / plain-decode latency models, the acceptance calibration, and the
stalls between decode iterations with the pace they leave a request. `PolicyBase`
(`policies/base.py`) feeds it from each iteration's `Outcome`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sgl_adaspec.speculative.accept_calibration import AcceptanceCalibration
from sgl_adaspec.speculative.latency import LinearLatency, VerifyLatency
from sgl_adaspec.speculative.shapes import draft_rows
from sgl_adaspec.speculative.stats import SpecStats

if TYPE_CHECKING:
    from sgl_adaspec.speculative.policies.base import Outcome

# Plain iterations in a row that price a plain decode even if none was steady (`observe`).
MAX_PLAIN_UNFITTED = 3
# Weight of the past, per iteration, in the decayed sums behind `wall_per_decode`.
STALL_DECAY = 0.99


@dataclass(kw_only=True)
class PolicyMeasurements:
    """The measured state every policy shares (the statistics included, which it keeps current).

    - latency_smoothing: weight of the newest measurement in the moving averages;
    - baseline_tpot_ms_config: TPOT without speculation if given (else estimated online as the
      smoothed verify-pass latency: one target forward, like a plain decode step)."""

    latency_smoothing: float = 0.3
    baseline_tpot_ms_config: float | None = None
    stats: SpecStats = field(default_factory=SpecStats)
    # Smoothed wall time of a whole iteration (draft + verify) and of the verify pass, ms.
    t_spec_ms: float | None = None
    verify_ms: float | None = None
    # Verify-pass latency vs (verified tokens, context tokens); draft latency per draft step.
    verify_latency: VerifyLatency = field(default_factory=VerifyLatency)
    draft_step_ms: float | None = None
    # What a speculative iteration costs besides the verify pass, vs (draft steps, draft rows:
    # `shapes.draft_rows`): draft forwards, draft extend, tree building, the scheduler's
    # work; the intercept is the fixed price of speculating.
    draft_latency: LinearLatency = field(default_factory=lambda: LinearLatency(num_features=2))
    # A whole iteration without speculation vs requests n (the verify model's shape), measured
    # as it runs, not read off verify passes: the scheduler's work around it is its own. No
    # context: a slope over the narrow range of contexts a run of plain iterations sees
    # extrapolates its noise, and the window follows the context as it grows.
    plain_latency: VerifyLatency = field(default_factory=lambda: VerifyLatency(with_context=False))
    # Maps the draft's path probability to the acceptance the target shows (learned online).
    acceptance: AcceptanceCalibration = field(default_factory=AcceptanceCalibration)
    _last_verify_ms: float | None = field(default=None, repr=False)
    # Requests of the last iteration if it ran plain, else 0; plain ones since one was fitted.
    _previous_plain: int = field(default=0, repr=False)
    _plain_unfitted: int = field(default=0, repr=False)
    _last_verified_tokens: int = field(default=1, repr=False)
    # Decayed sums of decode iterations' wall time and of the stalls between them.
    _decode_ms_sum: float = field(default=0.0, repr=False)
    _stall_ms_sum: float = field(default=0.0, repr=False)
    # Decayed count, sum and sum of squares of the log wall time of decode iterations, stalls
    # included (`wall_spread`).
    _wall_log_sums: tuple = field(default=(0.0, 0.0, 0.0), repr=False)

    def observe_wall_time(self, iteration_ms: float, stall_ms: float) -> None:
        """A decode iteration's wall time and the stall before it, into the decayed sums behind
        `wall_per_decode` and `wall_spread`."""
        self._decode_ms_sum = STALL_DECAY * self._decode_ms_sum + iteration_ms
        self._stall_ms_sum = STALL_DECAY * self._stall_ms_sum + stall_ms
        wall_ms = iteration_ms + stall_ms
        if wall_ms > 0:
            x = math.log(wall_ms)
            count, total, squares = self._wall_log_sums
            self._wall_log_sums = (
                STALL_DECAY * count + 1.0, STALL_DECAY * total + x, STALL_DECAY * squares + x * x
            )  # fmt: skip

    def steady_plain(self, outcome: Outcome) -> bool:
        """Whether `outcome` (before `observe` takes it) is a steady plain iteration, a plain
        decode's price: a plain decode among plain ones of the same batch. The first after a
        prefill or after speculation also pays SGLang's switch (up to 2-3x a steady one), and
        the first after requests finished pays their release, once each, not per iteration."""
        return (
            not outcome.speculated
            and self._previous_plain == len(outcome.rids)
            and not outcome.after_prefill
        )

    @property
    def wall_per_decode(self) -> float:
        """Wall time a running request spends per ms of decode iterations, recently: 1 plus
        the stalls (prefills) between its iterations. A request on its SLO track at the end
        of an iteration falls behind it in the next stall, so while it decodes it must commit
        at this multiple of its SLO's pace."""
        if self._decode_ms_sum <= 0:
            return 1.0
        return 1.0 + self._stall_ms_sum / self._decode_ms_sum

    @property
    def wall_spread(self) -> float:
        """Standard deviation of the log wall time of recent decode iterations, the stalls
        before them included: how much the pace a request sees moves from one iteration to
        the next (bursts of arrivals, prefills, batch changes); 0 before two iterations."""
        count, total, squares = self._wall_log_sums
        if count < 2.0:
            return 0.0
        mean = total / count
        return math.sqrt(max(squares / count - mean * mean, 0.0))

    def _smooth(self, old: float | None, new: float) -> float:
        alpha = self.latency_smoothing
        return new if old is None else (1 - alpha) * old + alpha * new

    def observe_verify(
        self,
        latency_ms: float,
        verified_tokens: int = 0,
        context_tokens: int = 0,
        priced: bool = True,
    ) -> None:
        """The verify pass's latency; `priced=False` keeps it out of the cost model (a
        warm-up: `observe`)."""
        self.verify_ms = self._smooth(self.verify_ms, latency_ms)
        self._last_verify_ms = latency_ms
        if verified_tokens > 0 and priced:
            self._last_verified_tokens = verified_tokens
            self.verify_latency.observe((verified_tokens, context_tokens), latency_ms)
        self.stats.baseline_tpot_ms = self.baseline_tpot_ms()

    def observe_iteration(
        self,
        latency_ms: float,
        draft_depth: int = 0,
        num_requests: int = 1,
        draft_width: int = 1,
        priced: bool = True,
    ) -> None:
        """Wall time of one speculative iteration; with the verify pass just observed, what
        remains is the draft's share: `draft_depth` steps of a `draft_width` beam for
        `num_requests` requests (kept out of the draft cost model with `priced=False`)."""
        self.t_spec_ms = self._smooth(self.t_spec_ms, latency_ms)
        self.stats.t_spec_ms = self.t_spec_ms
        if draft_depth > 0 and self._last_verify_ms is not None and priced:
            rest_ms = max(latency_ms - self._last_verify_ms, 0.0)
            self.draft_step_ms = self._smooth(self.draft_step_ms, rest_ms / draft_depth)
            rows = draft_rows(draft_depth, draft_width, num_requests)
            self.draft_latency.observe((draft_depth, rows), rest_ms)
        self._last_verify_ms = None

    def observe_plain_iteration(
        self,
        latency_ms: float,
        num_requests: int = 1,
        context_tokens: int = 0,
        steady: bool = True,
    ) -> None:
        """Wall time of one iteration run without speculation; only `steady` ones (see
        `observe`) price a plain decode, unless none has come for MAX_PLAIN_UNFITTED in a row
        (prefills between every two decodes)."""
        self.t_spec_ms = self._smooth(self.t_spec_ms, latency_ms)
        self.stats.t_spec_ms = self.t_spec_ms
        self._last_verify_ms = None
        self._plain_unfitted += 1
        if steady or self._plain_unfitted >= MAX_PLAIN_UNFITTED:
            self.plain_latency.observe((num_requests, context_tokens), latency_ms)
            self._plain_unfitted = 0

    def baseline_tpot_ms(self) -> float | None:
        if self.baseline_tpot_ms_config is not None:
            return self.baseline_tpot_ms_config
        return self.verify_ms

    def verify_ms_per_token(self, verified_tokens: float | None = None) -> float | None:
        """Marginal verify-pass latency of one more verified token at `verified_tokens` (default:
        the last pass's count)."""
        tokens = self._last_verified_tokens if verified_tokens is None else verified_tokens
        return self.verify_latency.marginal_ms(tokens)

    def predict_verify_ms(self, verified_tokens: float, context_tokens: float) -> float | None:
        """Verify-pass latency for a batch of that size, from the fitted model (None before
        the first observation)."""
        return self.verify_latency.predict((verified_tokens, context_tokens))
