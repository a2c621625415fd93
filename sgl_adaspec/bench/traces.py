"""Arrival traces: when requests arrive and, where the trace says, how long they are.

Formats (data files stay outside the repository; `docs/evaluation.md` says where to get them):

* ``adaserve``: AdaServe's JSON list of requests, each ``{"emission_time_ms", "prompt",
  "input_length", "output_length", "slo_ratio"}``; ``slo_ratio`` < 0 is an absolute TPOT SLO of
  ``-slo_ratio`` ms, > 0 a multiple of the baseline TPOT.
* ``azure``: Azure LLM inference trace 2023 CSV, columns ``TIMESTAMP`` (``2023-11-16
  18:17:03.9799600``), ``ContextTokens``, ``GeneratedTokens``.
* ``timestamps``: AdaSpec's CSVs, one ``Timestamp`` column of arrival times in seconds and no
  token counts.
* synthetic Poisson or Gamma arrivals (`synthetic_trace`).

Every loader returns rows sorted by arrival, the first at 0 s. A malformed row raises TraceError
naming the file and the row (``line N`` of a CSV, header = line 1; ``entry N`` of a JSON list,
counted from 0).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Literal

import numpy as np

TraceFormat = Literal["adaserve", "azure", "timestamps"]
TRACE_FORMATS: tuple[str, ...] = ("adaserve", "azure", "timestamps")
ArrivalProcess = Literal["poisson", "gamma"]

ADASERVE_KEYS = ("emission_time_ms", "prompt", "input_length", "output_length", "slo_ratio")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
TIMESTAMP_COLUMN = "Timestamp"


class TraceError(ValueError):
    """A trace or prompt file that cannot be used; the message starts with the file and row."""


@dataclass(frozen=True)
class TraceRow:
    arrival_s: float  # seconds after the trace's first request
    input_tokens: int | None = None  # None: the trace has no token counts
    output_tokens: int | None = None
    prompt: str | None = None  # AdaServe traces carry their prompt
    slo_ratio: float | None = None  # AdaServe: < 0 absolute ms, > 0 multiple of baseline TPOT


def detect_format(path: Path) -> TraceFormat:
    """``.json`` is AdaServe; a CSV by its header (Azure columns or one ``Timestamp``)."""
    path = Path(path)
    if path.suffix.lower() == ".json":
        return "adaserve"
    header = _read_header(path)
    if set(AZURE_COLUMNS) <= set(header):
        return "azure"
    if [h.lower() for h in header] == [TIMESTAMP_COLUMN.lower()]:
        return "timestamps"
    raise TraceError(
        f"{path}: line 1: cannot tell the trace format from header {header}; expected "
        f"{', '.join(AZURE_COLUMNS)} (Azure) or {TIMESTAMP_COLUMN} (timestamps), or a .json "
        f"AdaServe trace; pass --trace-format"
    )


def load_trace(path: Path, trace_format: TraceFormat | Literal["auto"] = "auto") -> list[TraceRow]:
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    fmt = detect_format(path) if trace_format == "auto" else trace_format
    loaders = {
        "adaserve": load_adaserve_trace,
        "azure": load_azure_trace,
        "timestamps": load_timestamp_trace,
    }
    if fmt not in loaders:
        raise TraceError(f"unknown trace format {fmt!r}; choose one of: {', '.join(loaders)}")
    return loaders[fmt](path)


# --------------------------------------------------------------------------- AdaServe JSON


def load_adaserve_trace(path: Path) -> list[TraceRow]:
    path = Path(path)
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}: line {exc.lineno}: invalid JSON: {exc.msg}") from exc
    if not isinstance(entries, list):
        raise TraceError(f"{path}: expected a JSON list of requests, got {type(entries).__name__}")
    rows = [_adaserve_row(entry, f"{path}: entry {i}") for i, entry in enumerate(entries)]
    return _normalized(rows, path)


def _adaserve_row(entry, where: str) -> TraceRow:
    if not isinstance(entry, dict):
        raise TraceError(f"{where}: expected an object, got {type(entry).__name__}")
    missing = [key for key in ADASERVE_KEYS if key not in entry]
    if missing:
        raise TraceError(f"{where}: missing {', '.join(missing)}")
    prompt = entry["prompt"]
    if not isinstance(prompt, str) or not prompt:
        raise TraceError(f"{where}: prompt must be a non-empty string")
    ratio = _finite(entry["slo_ratio"], where, "slo_ratio")
    if ratio == 0:
        raise TraceError(f"{where}: slo_ratio must be < 0 (ms) or > 0 (x baseline), got 0")
    return TraceRow(
        arrival_s=_non_negative(entry["emission_time_ms"], where, "emission_time_ms") / 1000,
        input_tokens=_count(entry["input_length"], where, "input_length"),
        output_tokens=_count(entry["output_length"], where, "output_length"),
        prompt=prompt,
        slo_ratio=ratio,
    )


# --------------------------------------------------------------------------- CSVs


def load_azure_trace(path: Path) -> list[TraceRow]:
    path = Path(path)
    rows = []
    with open(path, newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(handle)
        header = [h.strip() for h in next(reader, [])]
        missing = [c for c in AZURE_COLUMNS if c not in header]
        if missing:
            raise TraceError(f"{path}: line 1: missing column(s) {', '.join(missing)}")
        col = {name: header.index(name) for name in AZURE_COLUMNS}
        first: datetime | None = None
        for fields in reader:
            where = f"{path}: line {reader.line_num}"
            if not fields:
                continue
            if len(fields) != len(header):
                raise TraceError(f"{where}: expected {len(header)} fields, got {len(fields)}")
            stamp = _timestamp(fields[col["TIMESTAMP"]], where)
            first = stamp if first is None else min(first, stamp)
            n_in = _count_text(fields[col["ContextTokens"]], where, "ContextTokens")
            n_out = _count_text(fields[col["GeneratedTokens"]], where, "GeneratedTokens")
            rows.append((stamp, n_in, n_out))
    parsed = [
        TraceRow((stamp - first).total_seconds(), input_tokens=n_in, output_tokens=n_out)
        for stamp, n_in, n_out in rows
    ]
    return _normalized(parsed, path)


def load_timestamp_trace(path: Path) -> list[TraceRow]:
    path = Path(path)
    rows = []
    with open(path, newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(handle)
        header = [h.strip() for h in next(reader, [])]
        if [h.lower() for h in header] != [TIMESTAMP_COLUMN.lower()]:
            raise TraceError(
                f"{path}: line 1: expected the single column {TIMESTAMP_COLUMN}, got {header}"
            )
        for fields in reader:
            where = f"{path}: line {reader.line_num}"
            if not fields or fields == [""]:
                continue
            if len(fields) != 1:
                raise TraceError(f"{where}: expected 1 field, got {len(fields)}")
            try:
                value = float(fields[0])
            except ValueError:
                raise TraceError(f"{where}: {TIMESTAMP_COLUMN} {fields[0]!r} is not a number")
            rows.append(TraceRow(_non_negative(value, where, TIMESTAMP_COLUMN)))
    return _normalized(rows, path)


def _read_header(path: Path) -> list[str]:
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            return [h.strip() for h in next(csv.reader(handle), [])]
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read: {exc}") from exc


def _timestamp(text: str, where: str) -> datetime:
    try:
        # Azure writes 7 fractional digits (100 ns); Python >= 3.11 parses any number of them.
        return datetime.fromisoformat(text.strip())
    except ValueError:
        raise TraceError(
            f"{where}: TIMESTAMP {text!r} is not a date-time like 2023-11-16 18:17:03.9799600"
        )


# --------------------------------------------------------------------------- synthetic


def synthetic_trace(
    num_requests: int, process: ArrivalProcess, rng: np.random.Generator, gamma_cv: float = 2.0
) -> list[TraceRow]:
    """Arrivals at 1 request/s on average (rescale with `Workload.at_rate`), no token counts.

    Poisson: exponential gaps. Gamma: gaps with coefficient of variation ``gamma_cv`` (shape
    1/cv^2, mean 1): cv > 1 is burstier than Poisson, cv = 1 is Poisson.
    """
    if num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    if process == "poisson":
        gaps = rng.exponential(1.0, num_requests - 1)
    elif process == "gamma":
        if not gamma_cv > 0:
            raise ValueError(f"gamma_cv must be > 0, got {gamma_cv}")
        shape = 1.0 / gamma_cv**2
        gaps = rng.gamma(shape, 1.0 / shape, num_requests - 1)
    else:
        raise ValueError(f"unknown arrival process {process!r}; choose poisson or gamma")
    arrivals = np.concatenate([[0.0], np.cumsum(gaps)])
    return [TraceRow(float(t)) for t in arrivals]


# --------------------------------------------------------------------------- checks


def _normalized(rows: list[TraceRow], path: Path) -> list[TraceRow]:
    if not rows:
        raise TraceError(f"{path}: the trace has no requests")
    rows = sorted(rows, key=lambda row: row.arrival_s)  # stable: ties keep file order
    start = rows[0].arrival_s
    return [replace(row, arrival_s=row.arrival_s - start) for row in rows]


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite(value, where: str, name: str) -> float:
    if not _is_number(value) or not math.isfinite(value):
        raise TraceError(f"{where}: {name} must be a finite number, got {value!r}")
    return float(value)


def _non_negative(value, where: str, name: str) -> float:
    value = _finite(value, where, name)
    if value < 0:
        raise TraceError(f"{where}: {name} must be >= 0, got {value:g}")
    return value


def _count_text(text: str, where: str, name: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise TraceError(f"{where}: {name} {text!r} is not an integer")
    return _count(value, where, name)


def _count(value, where: str, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise TraceError(f"{where}: {name} must be an integer >= 1, got {value!r}")
    return value
