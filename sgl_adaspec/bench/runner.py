"""One bench: build the workload, get the baseline TPOT if needed, then for every server (started
here one policy after another, or already running) replay the workload at every request rate.

Only one server started here runs at a time. A policy whose server cannot start, or starts with
the policy switched off (SGLang turns ``--speculative-adaptive`` off with only a warning when it
cannot run it), is reported with its reason and the bench goes on with the next one.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import requests

from sgl_adaspec.bench.http_stream import APIS, Api
from sgl_adaspec.bench.metrics import RequestRecord, RunSummary, summarize
from sgl_adaspec.bench.policies import (
    LAUNCH_RECIPES,
    NO_SPECULATION,
    SpecShape,
    check_shape,
    get_policy,
    is_speculative,
)
from sgl_adaspec.bench.prompts import HfTokenizer
from sgl_adaspec.bench.replay import ReplayTarget, SloField, SloSettings, replay
from sgl_adaspec.bench.server_probe import (
    adaspec_stats,
    measure_baseline_tpot_ms,
    served_model,
    server_info,
    warm_up,
)
from sgl_adaspec.bench.workloads import Workload, WorkloadSpec, build_workload
from sgl_adaspec.local_server.launch import CPU_FLAGS, Server
from sgl_adaspec.scheduler.slo_config import DEFAULT_SLO_CONFIG, load_slo_config

RunStatus = Literal["ok", "unavailable", "failed"]


class BenchError(RuntimeError):
    """Settings the bench cannot run with; the message says what to change."""


@dataclass(frozen=True)
class ServerSettings:
    """Servers the bench starts itself: same model and flags, one policy's flags added."""

    model: Path | None = None
    draft_model: Path | None = None
    device: Literal["cpu", "cuda"] = "cpu"  # cpu: the CPU recipe of sgl_adaspec.local_server.launch
    shape: SpecShape = SpecShape()
    extra_args: tuple[str, ...] = ()
    startup_timeout_s: float = 600.0

    @property
    def base_flags(self) -> tuple[str, ...]:
        return CPU_FLAGS if self.device == "cpu" else ()


@dataclass(frozen=True)
class BenchConfig:
    workload: WorkloadSpec
    out_dir: Path
    policies: tuple[str, ...] = ()  # servers started here, in this order
    external: tuple[tuple[str, str], ...] = ()  # (label, url) of running servers
    servers: ServerSettings = ServerSettings()
    request_rates_per_s: tuple[float, ...] = ()  # empty: the trace's own rate
    slo_config_path: Path = DEFAULT_SLO_CONFIG
    slo_scale: float = 1.0
    baseline_tpot_ms: float | None = None  # None: measured when a class is relative to it
    baseline_url: str | None = None  # a running server without speculation to measure it on
    slo_field: SloField = "tpot_slo_ms"
    ttft_slo_ms: tuple[tuple[str, float], ...] = ()  # per class, see SloSettings
    api: Api = "generate"
    tokenizer: Path | None = None  # None: the model's
    request_timeout_s: float = 600.0
    baseline_requests: int = 3
    baseline_output_tokens: int = 64
    progress: bool = True

    def __post_init__(self) -> None:
        if not self.policies and not self.external:
            raise BenchError("nothing to replay against: give policies to start or server URLs")
        for name in self.policies:
            check_shape(get_policy(name), self.servers.shape)
        labels = [*self.policies, *(label for label, _ in self.external)]
        if len(set(labels)) != len(labels):
            raise BenchError(f"server labels must be unique, got {labels}")
        if self.policies and self.servers.model is None:
            raise BenchError("starting servers needs a model (--model)")
        if any(map(is_speculative, self.policies)) and self.servers.draft_model is None:
            raise BenchError("speculative policies need a draft model (--draft-model)")
        if any(not rate > 0 for rate in self.request_rates_per_s):
            raise BenchError(f"request rates must be > 0, got {self.request_rates_per_s}")
        if self.api not in APIS:
            raise BenchError(f"unknown api {self.api!r}; choose one of: {', '.join(APIS)}")
        SloSettings(self.slo_scale, self.baseline_tpot_ms, self.slo_field, self.ttft_slo_ms)

    @property
    def tokenizer_path(self) -> Path | None:
        return self.tokenizer or self.servers.model


@dataclass(frozen=True)
class RunResult:
    label: str
    policy: str | None  # None: a server the bench did not start
    request_rate_per_s: float | None  # None: the trace's own timing, unscaled
    status: RunStatus
    reason: str | None = None
    summary: RunSummary | None = None
    records: tuple[RequestRecord, ...] = ()
    server_stats: dict | None = None  # adaspec stats after the run (cumulative since start)

    def as_dict(self) -> dict:
        return {
            "label": self.label,
            "policy": self.policy,
            "request_rate_per_s": self.request_rate_per_s,
            "status": self.status,
            "reason": self.reason,
            "summary": self.summary.as_dict() if self.summary else None,
            "server_stats": self.server_stats,
            "requests": [r.as_dict() for r in self.records],
        }


@dataclass(frozen=True)
class BenchResult:
    workload: str
    num_requests: int
    native_rate_per_s: float | None  # the trace's own mean rate (None: one request)
    class_names: tuple[str, ...]
    baseline_tpot_ms: float | None
    runs: tuple[RunResult, ...]
    settings: dict = field(default_factory=dict)

    def load_per_s(self, run: RunResult) -> float | None:
        """The request rate a run replayed at (the trace's own when not rescaled)."""
        rate = run.request_rate_per_s
        return rate if rate is not None else self.native_rate_per_s

    def as_dict(self) -> dict:
        return {
            "workload": self.workload,
            "num_requests": self.num_requests,
            "native_rate_per_s": self.native_rate_per_s,
            "class_names": list(self.class_names),
            "baseline_tpot_ms": self.baseline_tpot_ms,
            "settings": self.settings,
            "runs": [run.as_dict() for run in self.runs],
        }


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def run_bench(config: BenchConfig) -> BenchResult:
    slo_config = load_slo_config(config.slo_config_path)
    needs_tok = config.workload.needs_tokenizer and config.tokenizer_path is not None
    tokenizer = HfTokenizer(config.tokenizer_path) if needs_tok else None
    workload = build_workload(config.workload, slo_config, tokenizer)
    log(f"workload {workload.name}: {len(workload.requests)} requests over "
        f"{workload.duration_s:.1f} s, classes {', '.join(workload.class_names)}")  # fmt: skip
    rates = config.request_rates_per_s or (None,)
    baseline = config.baseline_tpot_ms
    policies = list(config.policies)
    if workload.needs_baseline and baseline is None:
        baseline, policies = _baseline_plan(config, workload, policies)
    runs: list[RunResult] = []
    for policy in policies:
        with _started(config, policy, baseline) as (server, status, reason):
            if server is None:
                log(f"{policy}: {status}: {reason}")
                if workload.needs_baseline and baseline is None:
                    raise BenchError(f"no baseline TPOT: the {policy} server: {reason}")
                runs += [RunResult(policy, policy, rate, status, reason) for rate in rates]
                continue
            if baseline is None and policy == NO_SPECULATION and workload.needs_baseline:
                baseline = _measure(config, workload, server.url)
            runs += _replay_rates(config, workload, rates, policy, policy, server.url, baseline)
    for label, url in config.external:
        runs += _replay_rates(config, workload, rates, label, None, url, baseline)
    return BenchResult(
        workload=workload.name,
        num_requests=len(workload.requests),
        native_rate_per_s=workload.rate_per_s,
        class_names=workload.class_names,
        baseline_tpot_ms=baseline,
        runs=tuple(runs),
        settings=_settings(config),
    )


# --------------------------------------------------------------------------- baseline


def _baseline_plan(
    config: BenchConfig, workload: Workload, policies: list[str]
) -> tuple[float | None, list[str]]:
    """Measure the baseline now, or move the ``none`` policy first to measure it on its server."""
    if NO_SPECULATION in policies:
        return None, [NO_SPECULATION, *(p for p in policies if p != NO_SPECULATION)]
    if config.baseline_url:
        return _measure(config, workload, config.baseline_url), policies
    if policies:
        with _started(config, NO_SPECULATION, None, "baseline") as (server, _, reason):
            if server is None:
                raise BenchError(f"no server without speculation for the baseline: {reason}")
            return _measure(config, workload, server.url), policies
    raise BenchError(
        "SLO classes relative to the baseline TPOT need --baseline-tpot-ms, --baseline-url, or a "
        f"'{NO_SPECULATION}' policy to measure it on"
    )


def _measure(config: BenchConfig, workload: Workload, url: str) -> float:
    prompts = [r.prompt for r in workload.requests[: config.baseline_requests]]
    warm_up(url, prompts[0])
    value = measure_baseline_tpot_ms(url, prompts, config.baseline_output_tokens)
    log(f"baseline TPOT {value:.2f} ms (batch 1, median over {len(prompts)} prompts, {url})")
    return value


# --------------------------------------------------------------------------- servers


@contextmanager
def _started(
    config: BenchConfig, policy: str, baseline_tpot_ms: float | None, tag: str = ""
) -> Iterator[tuple[Server | None, RunStatus, str | None]]:
    """(server, "ok", None) while it runs, or (None, status, why not); stopped afterwards."""
    recipe = get_policy(policy)
    settings = config.servers
    args = [*recipe.flags(settings.draft_model, settings.shape), *settings.extra_args]
    if recipe.plugin_policy and config.slo_field == "slo_class" and baseline_tpot_ms:
        args += ["--baseline-tpot-ms", f"{baseline_tpot_ms:.3f}"]  # resolve classes alike
    log_dir = Path(config.out_dir) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{policy}{'-' + tag if tag else ''}.log"
    server = Server(
        Path(settings.model), extra_args=tuple(args), base_flags=settings.base_flags,
        log_path=log_path, startup_timeout_s=settings.startup_timeout_s,
    )  # fmt: skip
    log(f"starting {policy} server (log: {log_path})")
    try:
        server.start()
    except (RuntimeError, TimeoutError) as exc:
        server.stop()
        yield None, "failed", f"server did not start: {_log_reason(log_path) or exc}"
        return
    try:
        if recipe.must_be_on and not server_info(server.url).get(recipe.must_be_on):
            off = _log_reason(log_path, recipe.off_reason_prefix) or f"see {log_path}"
            yield None, "unavailable", f"SGLang switched {recipe.must_be_on} off: {off}"
        else:
            yield server, "ok", None
    finally:
        server.stop()


def _log_reason(log_path: Path, prefix: str | None = None) -> str | None:
    """The log line starting (after the timestamp) with ``prefix``, else the last error line."""
    try:
        lines = Path(log_path).read_text(errors="replace").splitlines()
    except OSError:
        return None
    if prefix is not None:
        hits = [line[line.index(prefix) :] for line in lines if prefix in line]
        return hits[-1] if hits else None
    errors = [line.strip() for line in lines if "error" in line.lower() and line.strip()]
    return errors[-1][:300] if errors else (lines[-1][:300] if lines else None)


def _replay_rates(
    config: BenchConfig,
    workload: Workload,
    rates: tuple[float | None, ...],
    label: str,
    policy: str | None,
    url: str,
    baseline_tpot_ms: float | None,
) -> list[RunResult]:
    slo = SloSettings(config.slo_scale, baseline_tpot_ms, config.slo_field, config.ttft_slo_ms)
    try:
        warm_up(url, workload.requests[0].prompt)
        model = served_model(url) if config.api == "completions" else "default"
    except requests.RequestException as exc:
        log(f"{label}: failed: {exc}")
        return [RunResult(label, policy, rate, "failed", f"no answer: {exc}") for rate in rates]
    target = ReplayTarget(label, url, config.api, model)
    results = []
    for rate in rates:
        replayed = workload if rate is None else workload.at_rate(rate)
        rate_text = f"{rate:g} req/s" if rate is not None else "the trace's rate"
        log(f"{label}: replaying {len(replayed.requests)} requests at {rate_text}")
        run = replay(replayed, target, slo, config.request_timeout_s, config.progress)
        summary = summarize(list(run.records), run.wall_s)
        results.append(RunResult(label, policy, rate, "ok", None, summary, run.records,
                                 _stats_or_none(url)))  # fmt: skip
    return results


def _stats_or_none(url: str) -> dict | None:
    try:
        return adaspec_stats(server_info(url))
    except requests.RequestException:  # a server that died during the run: its records say so
        return None


def _settings(config: BenchConfig) -> dict:
    spec = config.workload
    return {
        "trace": str(spec.trace_path) if spec.trace_path else None,
        "synthetic": spec.synthetic,
        "num_requests": spec.num_requests,
        "class_mix": dict(spec.class_mix) if spec.class_mix else None,
        "seed": spec.seed,
        "request_rates_per_s": list(config.request_rates_per_s),
        "slo_config": str(config.slo_config_path),
        "slo_scale": config.slo_scale,
        "slo_field": config.slo_field,
        "api": config.api,
        "model": str(config.servers.model) if config.servers.model else None,
        "draft_model": str(config.servers.draft_model) if config.servers.draft_model else None,
        "spec_shape": vars(config.servers.shape),
        "policies": list(config.policies),
        "external": dict(config.external),
        "known_policies": list(LAUNCH_RECIPES),
    }
