"""Synthetic workload: Poisson arrivals, a class mix, lognormal prompt and output lengths.

Classes follow AdaServe's evaluation (Table 2: coding copilot / chatbot / summarization, mix
60/20/20). The length distributions are assumptions shaped after the datasets the paper samples
(HumanEval prompts ~150 tokens, Alpaca instructions ~50, CNN/DailyMail articles ~1000; outputs a
few hundred tokens at most); real traces and datasets are loaded by `sgl_adaspec.bench`, not here.
TPOT SLOs come from the SLO config (`sgl_adaspec/data/slo_classes.yaml`), resolved against the
latency model's baseline TPOT for relative classes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sgl_adaspec.scheduler.slo_config import SloConfig


@dataclass(frozen=True)
class LengthDist:
    """Lognormal with the given mean (tokens) and log-space sigma, clipped to [low, high]."""

    mean: float
    sigma: float
    low: int
    high: int

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        mu = np.log(self.mean) - self.sigma**2 / 2  # so that E[x] = mean before clipping
        values = np.rint(rng.lognormal(mu, self.sigma, size))
        return np.clip(values, self.low, self.high).astype(np.int64)


@dataclass(frozen=True)
class RequestClass:
    name: str  # an SLO class of the SLO config
    share: float
    prompt: LengthDist
    output: LengthDist  # tokens generated, the prefill's first token included (>= 2)


DEFAULT_CLASSES = (
    RequestClass("coding", 0.6, LengthDist(150, 0.4, 16, 1024), LengthDist(200, 0.5, 16, 1024)),
    RequestClass("chat", 0.2, LengthDist(50, 0.6, 8, 512), LengthDist(180, 0.6, 16, 1024)),
    RequestClass(
        "summarization", 0.2, LengthDist(1000, 0.4, 128, 4096), LengthDist(120, 0.4, 16, 512)
    ),
)


@dataclass(frozen=True)
class WorkloadArrays:
    """R requests sorted by arrival. Arrays [R]: arrival_s, class_index (into class_names),
    prompt_tokens, output_tokens (>= 2), tpot_slo_ms (NaN = best effort)."""

    class_names: tuple[str, ...]
    arrival_s: np.ndarray
    class_index: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    tpot_slo_ms: np.ndarray

    @property
    def num_requests(self) -> int:
        return self.arrival_s.shape[0]


def poisson_workload(
    rate_rps: float,
    num_requests: int,
    slo_config: SloConfig,
    baseline_tpot_ms: float,
    seed: int,
    classes: tuple[RequestClass, ...] = DEFAULT_CLASSES,
) -> WorkloadArrays:
    """`num_requests` Poisson arrivals at `rate_rps`; each request's class drawn from the mix."""
    if rate_rps <= 0 or num_requests < 1:
        raise ValueError(f"need rate > 0 and >= 1 request, got {rate_rps}, {num_requests}")
    shares = np.array([c.share for c in classes])
    if np.any(shares < 0) or not np.isclose(shares.sum(), 1.0):
        raise ValueError(f"class shares must be >= 0 and sum to 1: {shares}")
    rng = np.random.default_rng(seed)
    # Unit-rate gaps scaled by the rate: one seed gives the same trace at every rate, compressed.
    arrival = np.cumsum(rng.standard_exponential(num_requests)) / rate_rps
    class_index = rng.choice(len(classes), size=num_requests, p=shares)
    prompt = np.empty(num_requests, dtype=np.int64)
    output = np.empty(num_requests, dtype=np.int64)
    slo = np.empty(num_requests)
    for i, cls in enumerate(classes):
        if cls.output.low < 2:
            raise ValueError(f"class {cls.name}: outputs need >= 2 tokens (one decoded)")
        rows = class_index == i
        count = int(rows.sum())
        prompt[rows] = cls.prompt.sample(rng, count)
        output[rows] = cls.output.sample(rng, count)
        slo[rows] = _class_tpot_ms(slo_config, cls.name, baseline_tpot_ms)
    return WorkloadArrays(tuple(c.name for c in classes), arrival, class_index, prompt, output, slo)


def _class_tpot_ms(slo_config: SloConfig, name: str, baseline_tpot_ms: float) -> float:
    if name not in slo_config.classes:
        known = list(slo_config.classes)
        raise KeyError(f"request class {name!r} is not in the SLO config ({known})")
    target = slo_config.classes[name].resolve_ms(baseline_tpot_ms)
    return float("nan") if target is None else target
