"""How planned speculation delivered against its plans (`PlanTrackRecord`), and how a fitted
price held at one load (`PriceRecord`). A plan's inputs are estimates: where they fall short
(a probe's lucky draft lifting the gain table), speculation must beat a plain decode by what
it has been falling short.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


def load_bucket(num_requests: int) -> int:
    """Loads within 2x share a bucket: 1, 2-3, 4-7, 8-15, ..."""
    return max(num_requests, 1).bit_length()


# Weight of the past per planned iteration.
RECORD_DECAY = 0.85
# Planned iterations before the record speaks: one outcome is mostly the acceptance's noise.
MIN_RECORD = 3.0


@dataclass
class PlanTrackRecord:
    """Decayed sums of planned iterations' committed tokens and wall time, realized and
    predicted."""

    decay: float = RECORD_DECAY
    weight: float = 0.0  # decayed count of observed iterations
    tokens: float = 0.0
    ms: float = 0.0
    predicted_tokens: float = 0.0
    predicted_ms: float = 0.0

    def observe(
        self, predicted_tokens: float, predicted_ms: float, tokens: float, ms: float
    ) -> None:
        if min(predicted_tokens, predicted_ms, tokens, ms) < 0 or predicted_ms == 0 or ms == 0:
            raise ValueError(
                f"track record needs non-negative tokens and positive times, got predicted "
                f"{predicted_tokens} tokens in {predicted_ms} ms, realized {tokens} in {ms} ms"
            )
        d = self.decay
        self.weight = d * self.weight + 1.0
        self.tokens = d * self.tokens + tokens
        self.ms = d * self.ms + ms
        self.predicted_tokens = d * self.predicted_tokens + predicted_tokens
        self.predicted_ms = d * self.predicted_ms + predicted_ms

    @property
    def ratio(self) -> float:
        """Realized over predicted tokens per ms; 1.0 until MIN_RECORD iterations are in."""
        if self.weight < MIN_RECORD or self.predicted_tokens <= 0:
            return 1.0
        return (self.tokens / self.ms) / (self.predicted_tokens / self.predicted_ms)

    def required_edge(self, margin: float) -> float:
        """A record below 1 asks 1 / ratio more; one above 1 lowers nothing."""
        return (1.0 + margin) / min(self.ratio, 1.0) - 1.0


# Steady plain iterations a `PriceRecord` keeps at one load.
PRICE_SPAN = 8


@dataclass
class PriceRecord:
    """The last PRICE_SPAN measurements at one load: a few dear iterations at loads a batch
    passes through lift the fitted line at every load, an edge for speculation that is not
    real."""

    measured: deque = field(default_factory=lambda: deque(maxlen=PRICE_SPAN))
    count: int = 0  # measurements ever made: names the record's state

    def observe(self, features: tuple[float, ...], ms: float) -> None:
        if not ms > 0:
            raise ValueError(f"price record needs a positive time, got {ms} ms")
        self.measured.append((features, ms))
        self.count += 1

    def factor(self, predict: Callable[[tuple[float, ...]], float | None]) -> float:
        """The median of measured over predicted, so one stall does not move it; 1.0 until
        MIN_RECORD are in."""
        if len(self.measured) < MIN_RECORD:
            return 1.0
        ratios = []
        for features, ms in self.measured:
            predicted = predict(features)
            if predicted is None or predicted <= 0:
                return 1.0
            ratios.append(ms / predicted)
        return statistics.median(ratios)
