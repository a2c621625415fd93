"""A workload: the requests of one replay, each with its arrival time, prompt, length and SLO.

Built from a trace (`traces.py`) or synthetic arrivals, filled with prompts (`prompts.py`),
optionally cut to the first N requests, and rescaled to a target request rate. SLOs:

* AdaServe traces carry theirs (``slo_ratio``); the class is the SLO config's class with the same
  target (``custom`` otherwise).
* Otherwise, and whenever a class mix is given, each request draws a class of the SLO config
  (``sgl_adaspec/data/slo_classes.yaml``) with the mix's weights (default: equal weights).

A class relative to the baseline TPOT stays relative here (`RequestSlo.baseline_multiple`); the
replay resolves it once the baseline is known (`replay.SloSettings`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np

from sgl_adaspec.bench.prompts import BUILTIN_PROMPTS, PromptMatcher, Tokenizer, load_spec_bench
from sgl_adaspec.bench.traces import (
    ArrivalProcess,
    TraceFormat,
    TraceRow,
    detect_format,
    load_trace,
    synthetic_trace,
)
from sgl_adaspec.scheduler.request_slo import CUSTOM_CLASS, RequestSlo, parse_request_slo
from sgl_adaspec.scheduler.slo_config import SloConfig


class WorkloadError(ValueError):
    """Workload settings that cannot produce a workload; the message says which."""


@dataclass(frozen=True)
class WorkloadSpec:
    """Where the requests come from. Exactly one of ``trace_path`` and ``synthetic``."""

    trace_path: Path | None = None
    trace_format: TraceFormat | Literal["auto"] = "auto"
    synthetic: ArrivalProcess | None = None
    gamma_cv: float = 2.0
    num_requests: int | None = None  # the trace's first N requests; required when synthetic
    prompts_path: Path | None = None  # Spec-Bench question.jsonl; None: built-in prompts
    input_tokens: int | None = None  # traces without counts: match prompts to this length
    output_tokens: int = 128  # traces without counts: tokens to generate
    max_input_tokens: int | None = None  # cut longer prompts (the model's context is finite)
    max_output_tokens: int | None = None
    class_mix: tuple[tuple[str, float], ...] | None = None  # (class, weight); overrides slo_ratio
    seed: int = 0

    def __post_init__(self) -> None:
        if (self.trace_path is None) == (self.synthetic is None):
            raise WorkloadError("give exactly one of a trace file and a synthetic arrival process")
        if self.synthetic is not None and self.num_requests is None:
            raise WorkloadError("a synthetic workload needs a number of requests")
        for name in ("num_requests", "input_tokens", "output_tokens", "max_input_tokens",
                     "max_output_tokens"):  # fmt: skip
            value = getattr(self, name)
            if value is not None and value < 1:
                raise WorkloadError(f"{name} must be >= 1, got {value}")
        if not self.gamma_cv > 0:
            raise WorkloadError(f"gamma_cv must be > 0, got {self.gamma_cv}")
        if self.class_mix is not None:
            if not self.class_mix or any(not w >= 0 for _, w in self.class_mix):
                raise WorkloadError(f"class mix weights must be >= 0, got {self.class_mix}")
            if sum(w for _, w in self.class_mix) <= 0:
                raise WorkloadError("class mix weights sum to 0")

    @property
    def resolved_format(self) -> TraceFormat | None:
        if self.trace_path is None:
            return None
        return detect_format(self.trace_path) if self.trace_format == "auto" else self.trace_format

    @property
    def needs_tokenizer(self) -> bool:
        """Matching prompts to token counts (or cutting them) needs the model's tokenizer."""
        return (
            self.resolved_format == "azure"
            or self.input_tokens is not None
            or self.max_input_tokens is not None
        )


@dataclass(frozen=True)
class WorkloadRequest:
    index: int
    arrival_s: float  # seconds after the replay starts
    prompt: str
    output_tokens: int  # generated with ignore_eos, so exactly this many unless the server cuts
    slo: RequestSlo
    input_tokens: int | None = None  # as the trace states it / as matched; None: unknown


@dataclass(frozen=True)
class Workload:
    name: str
    requests: tuple[WorkloadRequest, ...]

    def __post_init__(self) -> None:
        if not self.requests:
            raise WorkloadError(f"workload {self.name!r} has no requests")

    @property
    def duration_s(self) -> float:
        return self.requests[-1].arrival_s - self.requests[0].arrival_s

    @property
    def rate_per_s(self) -> float | None:
        """Mean arrival rate, (n - 1) / span; None for one request or all at once."""
        n = len(self.requests)
        return (n - 1) / self.duration_s if n > 1 and self.duration_s > 0 else None

    @property
    def needs_baseline(self) -> bool:
        return any(r.slo.baseline_multiple is not None for r in self.requests)

    @property
    def class_names(self) -> tuple[str, ...]:
        return tuple(sorted({r.slo.slo_class for r in self.requests}))

    def at_rate(self, rate_per_s: float) -> "Workload":
        """The same requests with arrival times scaled to a mean rate of ``rate_per_s``."""
        arrivals = rescale_arrivals([r.arrival_s for r in self.requests], rate_per_s)
        requests = tuple(replace(r, arrival_s=t) for r, t in zip(self.requests, arrivals))
        return Workload(self.name, requests)


def rescale_arrivals(arrivals_s: list[float], rate_per_s: float) -> list[float]:
    """Stretch or squeeze sorted arrival times (first at 0) to a mean rate (n - 1) / span.

    The shape of the trace (bursts, gaps) is kept: every gap is multiplied by the same factor.
    """
    if not rate_per_s > 0:
        raise WorkloadError(f"request rate must be > 0, got {rate_per_s}")
    start = arrivals_s[0]
    span = arrivals_s[-1] - start
    if len(arrivals_s) < 2 or span <= 0:
        return [0.0 for _ in arrivals_s]
    factor = (len(arrivals_s) - 1) / span / rate_per_s
    return [(t - start) * factor for t in arrivals_s]


def parse_class_mix(text: str) -> tuple[tuple[str, float], ...]:
    """``"coding=0.6,chat=0.2,summarization=0.2"`` -> ((name, weight), ...)."""
    mix = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, weight = part.partition("=")
        if not sep or not name.strip():
            raise WorkloadError(f"class mix entry {part!r} is not NAME=WEIGHT")
        try:
            mix.append((name.strip(), float(weight)))
        except ValueError:
            raise WorkloadError(f"class mix entry {part!r}: weight {weight!r} is not a number")
    if not mix:
        raise WorkloadError(f"empty class mix {text!r}")
    return tuple(mix)


def class_slo(name: str, slo_config: SloConfig) -> RequestSlo:
    """The SLO of a named class, as the server resolves ``custom_params.slo_class``."""
    try:
        return parse_request_slo({"slo_class": name}, slo_config)
    except ValueError as exc:
        raise WorkloadError(str(exc)) from exc


def slo_from_ratio(ratio: float, slo_config: SloConfig) -> RequestSlo:
    """AdaServe's ``slo_ratio``: < 0 absolute ms, > 0 a multiple of the baseline TPOT."""
    for name, cls in slo_config.classes.items():
        if (ratio < 0 and cls.tpot_ms == -ratio) or (ratio > 0 and cls.baseline_multiple == ratio):
            return class_slo(name, slo_config)
    if ratio < 0:
        return RequestSlo(CUSTOM_CLASS, tpot_slo_ms=-ratio)
    return RequestSlo(CUSTOM_CLASS, baseline_multiple=ratio)


def build_workload(
    spec: WorkloadSpec, slo_config: SloConfig, tokenizer: Tokenizer | None = None
) -> Workload:
    rng = np.random.default_rng(spec.seed)
    if spec.needs_tokenizer and tokenizer is None:
        raise WorkloadError(
            "matching prompts to token counts needs the model's tokenizer (--tokenizer or --model)"
        )
    if spec.trace_path is not None:
        rows = load_trace(spec.trace_path, spec.trace_format)
        name = Path(spec.trace_path).name
    else:
        rows = synthetic_trace(spec.num_requests, spec.synthetic, rng, spec.gamma_cv)
        name = f"{spec.synthetic}-{spec.num_requests}"
    rows = rows[: spec.num_requests] if spec.num_requests is not None else rows
    prompts = load_spec_bench(spec.prompts_path) if spec.prompts_path else BUILTIN_PROMPTS
    matcher = PromptMatcher(prompts, tokenizer) if tokenizer is not None else None
    classes = _draw_classes(spec, slo_config, len(rows), rng)
    requests = []
    for i, row in enumerate(rows):
        prompt, input_tokens = _prompt_for(row, spec, prompts, matcher, rng)
        output_tokens = row.output_tokens or spec.output_tokens
        if spec.max_output_tokens is not None:
            output_tokens = min(output_tokens, spec.max_output_tokens)
        # Without drawn classes the trace is AdaServe's, so every row has its slo_ratio.
        if classes is not None:
            slo = class_slo(classes[i], slo_config)
        else:
            slo = slo_from_ratio(row.slo_ratio, slo_config)
        requests.append(
            WorkloadRequest(i, row.arrival_s, prompt, output_tokens, slo, input_tokens)
        )
    return Workload(name, tuple(requests))


def _draw_classes(
    spec: WorkloadSpec, slo_config: SloConfig, n: int, rng: np.random.Generator
) -> list[str] | None:
    """One class per request from the mix; None when the trace's own SLOs apply."""
    if spec.class_mix is None and spec.resolved_format == "adaserve":
        return None
    mix = spec.class_mix or tuple((name, 1.0) for name in slo_config.classes)
    if not mix:
        raise WorkloadError("the SLO config has no classes; give a class mix")
    for name, _ in mix:
        class_slo(name, slo_config)  # unknown names fail here, listing the known ones
    names = [name for name, _ in mix]
    weights = np.array([w for _, w in mix], dtype=float)
    picks = rng.choice(len(names), size=n, p=weights / weights.sum())
    return [names[k] for k in picks]


def _prompt_for(
    row: TraceRow,
    spec: WorkloadSpec,
    prompts: tuple[str, ...],
    matcher: PromptMatcher | None,
    rng: np.random.Generator,
) -> tuple[str, int | None]:
    if row.prompt is not None:  # AdaServe: the trace's own prompt, cut if asked
        if spec.max_input_tokens is not None and matcher is not None:
            return matcher.truncate(row.prompt, spec.max_input_tokens), row.input_tokens
        return row.prompt, row.input_tokens
    wanted = row.input_tokens or spec.input_tokens
    if wanted is not None and spec.max_input_tokens is not None:
        wanted = min(wanted, spec.max_input_tokens)
    if wanted is None:
        prompt = prompts[rng.integers(len(prompts))]
        if spec.max_input_tokens is not None and matcher is not None:
            prompt = matcher.truncate(prompt, spec.max_input_tokens)
        return prompt, None
    return matcher.prompt_with_tokens(wanted, rng), wanted
