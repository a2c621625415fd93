"""Replay workloads against running SGLang servers and compare speculation policies by SLO
attainment and goodput (``python -m sgl_adaspec.bench``; docs/evaluation.md).

Modules, one concept each: `traces` (trace files, synthetic arrivals), `prompts` (prompt sets,
length matching), `workloads` (requests with SLOs, rate rescaling), `http_stream` (one timed
streamed request), `replay` (open-loop replay of a workload), `metrics` (attainment, goodput,
percentiles), `policies` (server recipes by name), `server_probe` (warm-up, baseline TPOT,
server stats), `runner` (a whole bench), `report` and `plots` (outputs), `cli`.
"""
