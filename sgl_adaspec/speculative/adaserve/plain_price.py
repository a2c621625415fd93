"""A plain decode's price per load (`PlainPrice`): the fitted line over every load, lowered
where the steady plain iterations measured at a load came in cheaper."""

from __future__ import annotations

from dataclasses import dataclass, field

from sgl_adaspec.speculative.adaserve.track_record import PriceRecord, load_bucket
from sgl_adaspec.speculative.latency import VerifyLatency

# Weight of the past in the share of warm plain iterations, per plain iteration.
WARM_SHARE_DECAY = 0.9


@dataclass
class PlainPrice:
    """The fit itself is the policy's (`PolicyBase.plain_latency`), passed to each call."""

    records: dict[int, PriceRecord] = field(default_factory=dict)  # per `load_bucket`
    # Decayed share of plain iterations that kept the draft warm: their price holds a draft
    # forward, which `AdaservePolicy._speculation_pays` takes out.
    warm_share: float = 0.0
    last_warm: bool = False  # the last plain iteration kept the draft warm
    _factors: dict = field(default_factory=dict, repr=False)  # bucket -> (state, factor)
    _loads: set = field(default_factory=set, repr=False)  # buckets the fit has measured

    @property
    def loads_measured(self) -> int:
        return len(self._loads)

    def price(self, fit: VerifyLatency, num_requests: int, context_tokens: int) -> float | None:
        """None while unfitted. Never raised above the fit: dear plain iterations (a batch
        filling or emptying) would make speculation look paying just when it is dear too."""
        fitted = fit.predict((num_requests, context_tokens))
        return None if fitted is None else fitted * self.factor(fit, num_requests)

    def factor(self, fit: VerifyLatency, num_requests: int) -> float:
        bucket = load_bucket(num_requests)
        record = self.records.get(bucket)
        if record is None:
            return 1.0
        state = (record.count, fit.version)
        cached = self._factors.get(bucket)
        if cached is None or cached[0] != state:
            factor = min(record.factor(fit.predict), 1.0)
            cached = self._factors[bucket] = (state, factor)
        return cached[1]

    def measured_at(self, fit: VerifyLatency, num_requests: int) -> bool:
        """Whether the fit holds a measurement at this load (within 2x)."""
        bucket = load_bucket(num_requests)
        if bucket not in self._loads:
            self._loads = {load_bucket(int(n)) for n in fit.feature_values(0)}
        return bucket in self._loads

    def observe_plain(self, warm: bool) -> None:
        self.last_warm = warm
        self.warm_share = WARM_SHARE_DECAY * self.warm_share + (1.0 - WARM_SHARE_DECAY) * float(
            warm
        )

    def observe_steady(self, num_requests: int, context_tokens: int, ms: float) -> None:
        record = self.records.setdefault(load_bucket(num_requests), PriceRecord())
        record.observe((num_requests, context_tokens), ms)
