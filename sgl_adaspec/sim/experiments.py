"""Experiments on the simulator. `rps-sweep`: AdaServe's Figures 8-9 in simulation (SLO
attainment and goodput vs request rate, classes coding / chat / summarization mixed 60/20/20)
for no speculation, SGLang's static tree, SGLang-style adaptive steps and adaserve.

Metrics (AdaServe 6.1): attainment = share of requests whose mean TPOT (from the first token, as
clients measure it) <= their SLO; goodput = output tokens of the requests that met their SLO /
makespan (first arrival to last finish), in tokens per second.
"""

from __future__ import annotations

import contextlib
import sys
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from sgl_adaspec.scheduler.cost_model import knee_budget
from sgl_adaspec.scheduler.slo_config import DEFAULT_SLO_CONFIG, load_slo_config
from sgl_adaspec.sim.acceptance import resolve as resolve_acceptance
from sgl_adaspec.sim.engine import EngineConfig, SimResult, check_decision_charge, simulate
from sgl_adaspec.sim.latency import get_preset
from sgl_adaspec.sim.policies import EXTRA_POLICY_NAMES, POLICY_NAMES, make_policy
from sgl_adaspec.sim.workload import poisson_workload

PEAK_METRIC = "adaserve_vs_static_attainment_at_peak"
TRACE_METRIC = "adaserve_minus_best_other_attainment_points"


@dataclass(frozen=True)
class SweepConfig:
    """The single home of the rps-sweep defaults (the CLI passes only what it was given)."""

    # The paper's setup (Table 1: Llama-3.1-70B, TP4 on A100-80GB, Llama-3.2-1B draft).
    preset: str = "a100x4-llama70b"
    rates_rps: tuple[float, ...] = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0)
    num_requests: int = 400  # per rate and seed
    repeats: int = 3  # seeds per rate; the table shows the mean
    policies: tuple[str, ...] = POLICY_NAMES
    seed: int = 0
    # JSON path or a name in acceptance.NAMED; None: acceptance.DEFAULT (the calibrated one)
    acceptance: str | None = None
    out_dir: str = "out/sim"
    max_running_requests: int = 128
    # The `trace` experiment: a trace file (bench formats), its time compression and, if set,
    # the multiple of every baseline-relative SLO (see `trace_replay`).
    trace: str | None = None
    trace_format: str = "auto"  # or one of bench.traces.TRACE_FORMATS; auto: from the file
    time_compression: float = 1.0
    relative_slo_scale: float | None = None
    # The `dp-dispatch` experiment: data-parallel replicas (`replicas.py`).
    replicas: int = 1
    # The `fleet` experiment (`fleet.py`): replica counts, and replicas per server where a
    # router spreads over servers that dispatch by SLO (two levels).
    fleet_replicas: tuple[int, ...] = (8, 32)
    server_replicas: int = 4
    # Charge each policy's own wall time to the simulated clock (`EngineConfig`); 0: not.
    policy_time_scale: float = 0.0
    charge_critical_path: str | None = None  # of it, only `decide`'s (`EngineConfig`)
    decision_ms: float | None = None  # a fixed decision in place of the host's (`EngineConfig`)
    observe_lag: int | None = None  # `EngineConfig.observe_lag`

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        if not self.fleet_replicas or min(self.fleet_replicas) < 1 or self.server_replicas < 1:
            raise ValueError(
                f"replica counts and replicas per server must be >= 1: {self.fleet_replicas}, "
                f"{self.server_replicas}"
            )
        if not self.rates_rps or any(not r > 0 for r in self.rates_rps):
            raise ValueError(f"rates must be > 0, got {self.rates_rps}")
        if self.num_requests < 1 or self.repeats < 1:
            raise ValueError(
                f"num_requests and repeats must be >= 1: {self.num_requests}, {self.repeats}"
            )
        if not self.time_compression > 0:
            raise ValueError(f"time compression must be > 0, got {self.time_compression}")
        if not self.policy_time_scale >= 0:
            raise ValueError(f"--charge-policy-time must be >= 0, got {self.policy_time_scale}")
        check_decision_charge(
            self.decision_ms, self.charge_critical_path,
            ("--charge-decision-ms", "--charge-critical-path"),
        )  # fmt: skip
        if self.max_running_requests < 1:
            raise ValueError(f"max running requests must be >= 1, got {self.max_running_requests}")
        known = POLICY_NAMES + EXTRA_POLICY_NAMES
        if not self.policies:
            raise ValueError(f"no policy given; choose from {', '.join(known)}")
        unknown = [p for p in self.policies if p not in known]
        if unknown:
            raise ValueError(f"unknown policies {unknown}; choose from {', '.join(known)}")


def summarize(result: SimResult) -> dict:
    """Attainment, goodput and per-class figures of one run."""
    workload = result.workload
    met = result.met
    makespan_s = float(np.nanmax(result.finish_s) - workload.arrival_s.min())
    per_class = {}
    for i, name in enumerate(workload.class_names):
        rows = workload.class_index == i
        if rows.any():
            per_class[name] = {
                "requests": int(rows.sum()),
                "attainment": float(met[rows].mean()),
                "mean_tpot_ms": float(result.tpot_ms[rows].mean()),
                "tpot_slo_ms": float(workload.tpot_slo_ms[rows][0]),
            }
    per_verify = result.request_iterations or 1
    return {
        "attainment": float(met.mean()),
        "goodput_tok_s": float((workload.output_tokens * met).sum() / makespan_s),
        "throughput_tok_s": float(workload.output_tokens.sum() / makespan_s),
        "makespan_s": makespan_s,
        "classes": per_class,
        "accept_length": 1.0 + result.accepted_drafts / per_verify,  # bonus included
        "verified_per_request": result.verified_tokens / per_verify,
        "mean_batch": result.request_iterations / max(result.iterations, 1),
        "iterations": result.iterations,
        "busy_ms": {
            "prefill": result.prefill_ms,
            "draft": result.draft_ms,
            "verify": result.verify_ms,
            "policy": result.policy_ms,
        },
    }


def mean_summary(runs: list[dict]) -> dict:
    """Mean over seeds of every number in the run summaries (same keys in every run)."""

    def merge(values: list):
        if isinstance(values[0], dict):
            return {key: merge([v[key] for v in values]) for key in values[0]}
        return float(np.mean(values))

    return merge(runs)


@dataclass(frozen=True)
class SweepSetup:
    """What every experiment on the sweep's workload shares: the latency and acceptance models,
    the SLO classes, adaserve's knee budget, the baseline TPOT and the seeds. One workload per
    seed, the same at every rate up to a time scale (as the paper rescales one trace to each
    rate: `poisson_workload` draws unit-rate gaps and divides by the rate), so curves compare
    like with like; every policy sees the same workloads and seeds."""

    config: SweepConfig
    latency: object
    acceptance: object
    slo_config: object
    budget: int
    baseline: float
    engine: EngineConfig
    seeds: tuple

    @classmethod
    def of(cls, config: SweepConfig) -> "SweepSetup":
        latency = get_preset(config.preset)
        seeds = tuple(
            np.random.SeedSequence([config.seed, repeat]).generate_state(2)
            for repeat in range(config.repeats)
        )
        return cls(
            config,
            latency,
            resolve_acceptance(config.acceptance),
            load_slo_config(DEFAULT_SLO_CONFIG),
            knee_budget(latency.verify_profile()),
            latency.baseline_tpot_ms,
            EngineConfig(
                max_running_requests=config.max_running_requests,
                policy_time_scale=config.policy_time_scale,
                charge_critical_path=config.charge_critical_path,
                decision_ms=config.decision_ms,
                observe_lag=config.observe_lag,
            ),
            seeds,
        )

    def workloads(self, rate: float) -> list:
        return [
            poisson_workload(rate, self.config.num_requests, self.slo_config, self.baseline, int(w))
            for w, _ in self.seeds
        ]

    def run(self, make_policy_for_seed, workloads: list) -> list[dict]:
        """One summary per seed; `make_policy_for_seed()` gives a fresh policy for each run."""
        runs = []
        for workload, (_, engine_seed) in zip(workloads, self.seeds):
            result = simulate(
                workload, self.latency, self.acceptance, make_policy_for_seed(),
                int(engine_seed), self.engine,
            )  # fmt: skip
            runs.append(summarize(result))
        return runs


@contextlib.contextmanager
def progress_bar(total: int, what: str):
    """A `progress` callback for the runs: one line per finished point, under a bar on a
    terminal (tqdm, on stderr; none where stderr is not a terminal)."""
    from tqdm import tqdm

    with tqdm(total=total, desc=what, unit="point", file=sys.stderr, disable=None) as bar:

        def progress(line: str) -> None:
            bar.write(line, file=sys.stdout)
            bar.update(1)

        yield progress


def run_rps_sweep(config: SweepConfig, progress=print) -> dict:
    setup = SweepSetup.of(config)
    latency, acceptance, slo_config = setup.latency, setup.acceptance, setup.slo_config
    budget, baseline = setup.budget, setup.baseline
    profile = latency.verify_profile()
    rows = []
    for rate in config.rates_rps:
        workloads = setup.workloads(rate)
        for name in config.policies:
            started = time.perf_counter()
            runs = setup.run(lambda: make_policy(name, budget, baseline), workloads)
            row = {"rate_rps": rate, "policy": name, **mean_summary(runs)}
            row["attainment_by_seed"] = [run["attainment"] for run in runs]
            row["wall_s"] = time.perf_counter() - started
            rows.append(row)
            progress(
                f"  rate {rate:g} rps {name:<16} attainment {row['attainment']:.3f} "
                f"goodput {row['goodput_tok_s']:.0f} tok/s ({row['wall_s']:.1f} s)"
            )
    return {
        "experiment": "rps-sweep",
        "config": asdict(config),
        "latency_model": {
            "name": latency.name,
            "description": latency.description,
            "provenance": latency.provenance,
            "baseline_tpot_ms": baseline,
            "verify_profile": profile.as_dict(),
            "adaserve_budget": budget,
        },
        "acceptance_model": acceptance.to_json(),
        "slo_ms": {
            name: slo_config.classes[name].resolve_ms(baseline) for name in slo_config.classes
        },
        "rows": rows,
        PEAK_METRIC: peak_ratio(rows, config.rates_rps),
    }


def peak_ratio(rows: list[dict], rates: tuple[float, ...]) -> float:
    """adaserve's attainment over static's at the highest rate (nan if either did not run)."""
    peak = max(rates)
    found = {r["policy"]: r["attainment"] for r in rows if r["rate_rps"] == peak}
    if "adaserve" not in found or "static" not in found:
        return math.nan
    if found["static"] == 0:
        return math.inf if found["adaserve"] > 0 else math.nan
    return found["adaserve"] / found["static"]


def format_table(sweep: dict) -> str:
    """Rate x policy: attainment (%) and goodput (tok/s)."""
    policies = list(dict.fromkeys(r["policy"] for r in sweep["rows"]))
    rates = list(dict.fromkeys(r["rate_rps"] for r in sweep["rows"]))
    cell = {(r["rate_rps"], r["policy"]): r for r in sweep["rows"]}
    width = 17
    head = f"{'rps':>5} | " + " | ".join(f"{p:^{width}}" for p in policies)
    sub = f"{'':>5} | " + " | ".join(f"{'attain':>7} {'goodput':>9}" for _ in policies)
    lines = [head, sub, "-" * len(head)]
    for rate in rates:
        parts = []
        for p in policies:
            row = cell[(rate, p)]
            parts.append(f"{100 * row['attainment']:6.1f}% {row['goodput_tok_s']:9.1f}")
        lines.append(f"{rate:>5g} | " + " | ".join(parts))
    return "\n".join(lines)


def write_plot(sweep: dict, path: Path) -> bool:
    """Attainment and goodput vs rate, one line per policy. False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    policies = list(dict.fromkeys(r["policy"] for r in sweep["rows"]))
    fig, (ax_att, ax_good) = plt.subplots(1, 2, figsize=(10, 4))
    for policy in policies:
        rows = [r for r in sweep["rows"] if r["policy"] == policy]
        rates = [r["rate_rps"] for r in rows]
        ax_att.plot(rates, [100 * r["attainment"] for r in rows], marker="o", label=policy)
        ax_good.plot(rates, [r["goodput_tok_s"] for r in rows], marker="o", label=policy)
    ax_att.set(xlabel="request rate (req/s)", ylabel="SLO attainment (%)", ylim=(0, 105))
    ax_good.set(xlabel="request rate (req/s)", ylabel="goodput (tokens/s)")
    ax_att.legend()
    model = sweep["latency_model"]["name"]
    acceptance = sweep["acceptance_model"]["name"]
    fig.suptitle(f"simulated: {model}, acceptance model {acceptance}, mix 60/20/20")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def describe(sweep: dict) -> str:
    lat, acc = sweep["latency_model"], sweep["acceptance_model"]
    slo = ", ".join(f"{k} {v:.1f} ms" for k, v in sweep["slo_ms"].items())
    cfg = sweep["config"]
    return "\n".join(
        [
            f"latency model: {lat['name']} ({lat['description']})",
            f"  baseline TPOT {lat['baseline_tpot_ms']:.2f} ms; knee of the verify profile "
            f"{lat['adaserve_budget']} (adaserve's B under the knee rule; the cost rule sizes B "
            f"itself)",
            f"acceptance model: {acc['name']}: {acc['source']}",
            f"SLOs: {slo}; mix coding/chat/summarization 60/20/20; Poisson arrivals, "
            f"{cfg['num_requests']} requests per run, mean of {cfg['repeats']} seeds per rate "
            f"(base seed {cfg['seed']})",
        ]
    )


def rps_sweep_main(config: SweepConfig) -> dict:
    """Run the sweep, print the header and table, write JSON and PNG, print the peak ratio last."""
    started = time.perf_counter()
    with progress_bar(len(config.rates_rps) * len(config.policies), "sweep") as progress:
        sweep = run_rps_sweep(config, progress)
    sweep["wall_s"] = time.perf_counter() - started
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "rps_sweep.json"
    json_path.write_text(json.dumps(sweep, indent=1, default=float) + "\n")
    print(describe(sweep))
    print(format_table(sweep))
    png_path = out / "rps_sweep.png"
    if write_plot(sweep, png_path):
        print(f"wrote {json_path} and {png_path} ({sweep['wall_s']:.0f} s)")
    else:
        print(f"wrote {json_path}; no plot: matplotlib is not installed ({sweep['wall_s']:.0f} s)")
    print(f"{PEAK_METRIC}={sweep[PEAK_METRIC]:.3f}")
    return sweep


def run_trace(config: SweepConfig, progress=print) -> dict:
    """Every policy on one trace (`config.trace`), mean of `config.repeats` engine seeds."""
    from sgl_adaspec.bench.traces import load_trace
    from sgl_adaspec.sim.trace_replay import mean_rate_rps, trace_workload

    if config.trace is None:
        raise ValueError("the trace experiment needs --trace PATH")
    setup = SweepSetup.of(config)
    workload = trace_workload(
        load_trace(Path(config.trace), config.trace_format), setup.slo_config, setup.baseline,
        time_compression=config.time_compression,
        relative_slo_scale=config.relative_slo_scale, seed=config.seed,
    )  # fmt: skip
    rate = mean_rate_rps(workload)
    rows = []
    for name in config.policies:
        started = time.perf_counter()
        runs = setup.run(
            lambda: make_policy(name, setup.budget, setup.baseline),
            [workload] * config.repeats,
        )
        row = {"rate_rps": rate, "policy": name, **mean_summary(runs)}
        row["wall_s"] = time.perf_counter() - started
        rows.append(row)
        progress(f"  {name:<16} attainment {row['attainment']:.3f} ({row['wall_s']:.1f} s)")
    others = [r["attainment"] for r in rows if r["policy"] != "adaserve"]
    ours = [r["attainment"] for r in rows if r["policy"] == "adaserve"]
    gap = 100 * (ours[0] - max(others)) if ours and others else math.nan
    return {
        "experiment": "trace",
        "config": asdict(config),
        "requests": workload.num_requests,
        "rate_rps": rate,
        "slo_ms": {
            name: float(np.nanmean(workload.tpot_slo_ms[workload.class_index == i]))
            for i, name in enumerate(workload.class_names)
        },
        "rows": rows,
        TRACE_METRIC: gap,
    }


def trace_main(config: SweepConfig) -> dict:
    """Run the trace experiment, print the table and per-class attainment, the gap last."""
    with progress_bar(len(config.policies), "trace") as progress:
        result = run_trace(config, progress)
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = Path(config.trace).stem
    json_path = out / f"trace_{name}_x{config.time_compression:g}.json"
    json_path.write_text(json.dumps(result, indent=1, default=float) + "\n")
    slo = ", ".join(f"{k} {v:.1f} ms" for k, v in result["slo_ms"].items())
    print(
        f"trace {config.trace}: {result['requests']} requests at {result['rate_rps']:.2f} req/s "
        f"(time compression {config.time_compression:g}); SLOs {slo}; preset {config.preset}, "
        f"mean of {config.repeats} seeds"
    )
    print(format_table(result))
    for row in result["rows"]:
        classes = ", ".join(
            f"{k} {100 * v['attainment']:.1f}%" for k, v in row["classes"].items()
        )
        print(f"  {row['policy']:<16} {classes}")
    print(f"wrote {json_path}")
    print(f"{TRACE_METRIC}={result[TRACE_METRIC]:.2f}")
    return result
