"""Prometheus export of the speculation statistics (SGLang's `--enable-metrics`).

SGLang runs prometheus_client in multiprocess mode: its launcher sets PROMETHEUS_MULTIPROC_DIR
before spawning the scheduler and serves the merged registry at `/metrics`. Metrics created in
the scheduler process therefore appear there, next to SGLang's own `sglang:*` series.
"""

from __future__ import annotations

import os

PREFIX = "sglang_adaspec:"
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
TPOT_BUCKETS_MS = (1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000, 2000)


def metrics_enabled() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


class PrometheusSink:
    """Mirrors `SpecStats.observe_*` calls into Prometheus series (labels: slo_class). The
    per-class counters of `slo_classes` exist from the start, at 0: a rate over a window needs a
    series before a class's first request, and attainment needs "met" before its first met SLO."""

    def __init__(self, slo_classes: tuple[str, ...] = ()) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self.finished = Counter(
            f"{PREFIX}requests_finished", "Finished requests per SLO class", ["slo_class"]
        )
        self.met = Counter(
            f"{PREFIX}requests_slo_met", "Finished requests that met their TPOT SLO", ["slo_class"]
        )
        self.tpot = Histogram(
            f"{PREFIX}request_tpot_ms", "Mean TPOT of finished requests (ms)", ["slo_class"],
            buckets=TPOT_BUCKETS_MS,
        )  # fmt: skip
        self.verified = Histogram(
            f"{PREFIX}verified_tokens_per_iteration",
            "Tokens sent to the target per speculative iteration (roots included)",
            buckets=TOKEN_BUCKETS,
        )
        self.accepted = Counter(
            f"{PREFIX}accepted_tokens", "Tokens committed by verification (bonus included)"
        )
        self.verifies = Counter(
            f"{PREFIX}request_verifies", "Request verifications (one per request per iteration)"
        )
        self.draft_rows = Counter(
            f"{PREFIX}draft_rows", "Rows of the draft's decode forwards (steps - 1) * requests * width"
        )
        self.exited = Counter(
            f"{PREFIX}early_exit_tokens",
            "Draft tokens that left the verify pass early (token-wise early exit)",
        )
        self.draft_accepted = Counter(
            f"{PREFIX}draft_tokens_accepted",
            "Accepted draft tokens (bonus excluded): predicted by the draft's raw path "
            "probabilities, by the calibrated ones, and observed",
            ["kind"],
        )
        self.plain = Counter(
            f"{PREFIX}plain_iterations",
            "Iterations run without speculation because no tree was worth its cost",
        )
        self.shape = Gauge(
            f"{PREFIX}iteration_shape",
            "Last iteration's budget B, depth d and width w, and the shape the draft ran",
            ["parameter"], multiprocess_mode="mostrecent",
        )  # fmt: skip
        for slo_class in slo_classes:
            self.finished.labels(slo_class)
            self.met.labels(slo_class)

    def observe_iteration(self, verified, accepted, budget, depth, width) -> None:
        self.verified.observe(sum(verified))
        self.accepted.inc(sum(accepted))
        self.verifies.inc(len(verified))
        for name, value in (("budget", budget), ("depth", depth), ("width", width)):
            self.shape.labels(name).set(value)

    def observe_draft(self, depth, width, rows) -> None:
        self.draft_rows.inc(rows)
        for name, value in (("draft_depth", depth), ("draft_width", width)):
            self.shape.labels(name).set(value)

    def observe_calibration(self, raw, calibrated, observed) -> None:
        for kind, value in (("predicted", raw), ("calibrated", calibrated), ("observed", observed)):
            self.draft_accepted.labels(kind).inc(max(value, 0.0))

    def observe_plain(self, num_requests) -> None:
        self.plain.inc()

    def observe_early_exit(self, tested, exited) -> None:
        self.exited.inc(exited)

    def observe_finished(self, slo_class: str, tpot_ms: float, met: bool) -> None:
        self.finished.labels(slo_class).inc()
        met_counter = self.met.labels(slo_class)  # at 0 until the class first meets its SLO
        if met:
            met_counter.inc()
        self.tpot.labels(slo_class).observe(tpot_ms)
