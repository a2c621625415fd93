"""Trace replay in simulation: a trace file the evaluation tool reads (AdaServe JSON with
`slo_ratio`, Azure CSV, AdaSpec timestamps CSV; `bench/traces.py`) as the simulator's
`WorkloadArrays`, with a time-compression factor, so systems can be compared on one trace as
AdaServe compares them.

- Arrivals: the trace's, divided by `time_compression` (2.0: twice the request rate).
- SLOs: an AdaServe row's `slo_ratio` (< 0: -ratio ms; > 0: ratio x the latency model's
  baseline TPOT), its class the SLO config's class with that target (`bench.workloads`);
  `relative_slo_scale` replaces the multiple of every baseline-relative SLO (AdaServe's
  SLO-scale experiment varies the coding class's, the only relative one in its traces). Rows
  without an SLO draw a class of the default mix (`workload.DEFAULT_CLASSES`).
- Lengths: the trace's token counts; where it has none, drawn from the row's class.
"""

from __future__ import annotations

import math

import numpy as np

from sgl_adaspec.bench.traces import TraceRow
from sgl_adaspec.bench.workloads import slo_from_ratio
from sgl_adaspec.scheduler.slo_config import SloConfig
from sgl_adaspec.sim.workload import DEFAULT_CLASSES, RequestClass, WorkloadArrays


def trace_workload(
    rows: list[TraceRow],
    slo_config: SloConfig,
    baseline_tpot_ms: float,
    *,
    time_compression: float = 1.0,
    relative_slo_scale: float | None = None,
    seed: int = 0,
    classes: tuple[RequestClass, ...] = DEFAULT_CLASSES,
) -> WorkloadArrays:
    """The trace's requests, in arrival order (see the module docstring)."""
    if not rows:
        raise ValueError("the trace has no requests")
    if not time_compression > 0:
        raise ValueError(f"time compression must be > 0, got {time_compression}")
    if relative_slo_scale is not None and not relative_slo_scale > 0:
        raise ValueError(f"the relative SLO scale must be > 0, got {relative_slo_scale}")
    rng = np.random.default_rng(seed)
    by_name = {cls.name: cls for cls in classes}
    shares = np.array([cls.share for cls in classes])
    names: list[str] = []
    class_of = np.empty(len(rows), dtype=np.int64)
    slo = np.empty(len(rows))
    prompt = np.empty(len(rows), dtype=np.int64)
    output = np.empty(len(rows), dtype=np.int64)
    for i, row in enumerate(rows):
        if row.slo_ratio is not None:
            request_slo = slo_from_ratio(row.slo_ratio, slo_config)
            name = request_slo.slo_class
            multiple = request_slo.baseline_multiple
            if multiple is not None and relative_slo_scale is not None:
                multiple = relative_slo_scale
            target = request_slo.tpot_slo_ms if multiple is None else multiple * baseline_tpot_ms
        else:
            name = classes[rng.choice(len(classes), p=shares / shares.sum())].name
            target = slo_config.classes[name].resolve_ms(baseline_tpot_ms)
        if name not in names:
            names.append(name)
        class_of[i] = names.index(name)
        slo[i] = math.nan if target is None else target
        drawn = by_name.get(name, classes[0])  # lengths of a class the mix does not know
        prompt[i] = row.input_tokens or int(drawn.prompt.sample(rng, 1)[0])
        output[i] = max(2, row.output_tokens or int(drawn.output.sample(rng, 1)[0]))
    arrival = np.array([row.arrival_s for row in rows]) / time_compression
    order = np.argsort(arrival, kind="stable")
    return WorkloadArrays(
        tuple(names), arrival[order], class_of[order], prompt[order], output[order], slo[order]
    )


def mean_rate_rps(workload: WorkloadArrays) -> float:
    """Requests per second over the trace's span (first to last arrival)."""
    span = float(workload.arrival_s[-1] - workload.arrival_s[0])
    return (workload.num_requests - 1) / span if span > 0 else math.inf
