"""The bench's outputs: JSON, the tables printed to stdout, and the closing ``name=value`` lines.

Closing lines: one ``attainment_<label>=<x>`` per server (SLO attainment averaged over the
request rates replayed), then, last, ``best_attainment_policy=<label>``: the server with the
highest mean attainment, ties broken by mean goodput (``unavailable`` when no server ran).
"""

from __future__ import annotations

import json
from pathlib import Path

from sgl_adaspec.bench.runner import BenchResult, RunResult

NO_RESULT = "unavailable"


def write_json(result: BenchResult, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result.as_dict(), indent=2) + "\n")
    return path


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _rate(result: BenchResult, run: RunResult) -> str:
    load = result.load_per_s(run)
    return "-" if load is None else f"{load:.3g}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    lines = [header, ["-" * w for w in widths], *rows]
    return "\n".join(
        "  ".join(f"{c:<{w}}" for c, w in zip(line, widths)).rstrip() for line in lines
    )


def _acc_per_verify(run: RunResult) -> tuple[str, str]:
    """(client: this run's meta_info, server: adaspec stats since the server started)."""
    client = run.summary.overall.accepted_tokens_per_verify if run.summary else None
    server = (run.server_stats or {}).get("accepted_tokens_per_verify")
    return _num(client, 2), _num(server, 2)


def overall_table(result: BenchResult) -> str:
    header = ["policy", "req/s", "status", "done", "met", "attain", "goodput tok/s",
              "tput tok/s", "TPOT p50/p90/p99 ms", "TTFT p50 ms", "acc/verify",
              "srv acc/verify"]  # fmt: skip
    rows = []
    for run in result.runs:
        if run.summary is None:
            rows.append([run.label, _rate(result, run), run.status] + ["-"] * (len(header) - 3))
            continue
        g = run.summary.overall
        tpot = "/".join(_num(g.tpot_ms[p]) for p in ("p50", "p90", "p99"))
        rows.append([
            run.label, _rate(result, run), run.status, f"{g.num_completed}/{g.num_requests}",
            str(g.num_met), f"{g.attainment:.3f}", _num(g.goodput_tokens_per_s),
            _num(g.throughput_tokens_per_s), tpot, _num(g.ttft_ms["p50"]),
            *_acc_per_verify(run),
        ])  # fmt: skip
    return _table(header, rows)


def class_table(result: BenchResult) -> str:
    header = ["policy", "req/s", "class", "SLO ms", "n", "met", "attain", "goodput tok/s",
              "TPOT p50/p90/p99 ms"]  # fmt: skip
    rows = []
    for run in result.runs:
        if run.summary is None:
            continue
        for name, g in run.summary.per_class.items():
            rows.append([
                run.label, _rate(result, run), name, _slo_text(run, name), str(g.num_requests),
                str(g.num_met), f"{g.attainment:.3f}", _num(g.goodput_tokens_per_s),
                "/".join(_num(g.tpot_ms[p]) for p in ("p50", "p90", "p99")),
            ])  # fmt: skip
    return _table(header, rows)


def _slo_text(run: RunResult, slo_class: str) -> str:
    targets = {r.tpot_slo_ms for r in run.records if r.slo_class == slo_class}
    if targets == {None}:
        return "none"
    values = sorted(t for t in targets if t is not None)
    return _num(values[0]) if len(values) == 1 else f"{values[0]:.1f}-{values[-1]:.1f}"


def notes(result: BenchResult) -> list[str]:
    lines = []
    if result.baseline_tpot_ms is not None:
        lines.append(f"baseline TPOT (no speculation, batch 1): {result.baseline_tpot_ms:.2f} ms")
    seen = set()
    for run in result.runs:
        if run.reason and run.label not in seen:
            seen.add(run.label)
            lines.append(f"{run.label}: {run.status}: {run.reason}")
    for run in result.runs:
        overall = run.summary.overall if run.summary else None
        failed = overall.num_requests - overall.num_completed if overall else 0
        if failed:
            first = next(r.error for r in run.records if r.error)
            lines.append(f"{run.label} @ {_rate(result, run)} req/s: {failed} failed, e.g. {first}")
    return lines


def mean_by_label(result: BenchResult, metric: str) -> dict[str, float]:
    """Mean over the ok runs of each server of an overall metric (e.g. ``attainment``)."""
    values: dict[str, list[float]] = {}
    for run in result.runs:
        if run.summary is not None:
            values.setdefault(run.label, []).append(getattr(run.summary.overall, metric))
    return {label: sum(v) / len(v) for label, v in values.items()}


def best_attainment_label(result: BenchResult) -> str:
    attainment = mean_by_label(result, "attainment")
    goodput = mean_by_label(result, "goodput_tokens_per_s")
    if not attainment:
        return NO_RESULT
    return max(attainment, key=lambda label: (attainment[label], goodput[label]))


def closing_lines(result: BenchResult) -> list[str]:
    attainment = mean_by_label(result, "attainment")
    lines = [f"attainment_{label}={value:.4f}" for label, value in attainment.items()]
    return [*lines, f"best_attainment_policy={best_attainment_label(result)}"]


def render(result: BenchResult, files: list[Path]) -> str:
    parts = [
        f"workload: {result.workload}, {result.num_requests} requests, classes "
        f"{', '.join(result.class_names)}",
        "",
        overall_table(result),
        "",
        class_table(result),
        "",
        *notes(result),
        *(f"wrote {path}" for path in files),
        *closing_lines(result),
    ]
    return "\n".join(parts)
