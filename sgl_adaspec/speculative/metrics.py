"""Prometheus export of the speculation statistics (SGLang's `--enable-metrics`), and the
per-request statistic each response carries (`VERIFIED_TOKENS_KEY`).

SGLang runs prometheus_client in multiprocess mode: its launcher sets PROMETHEUS_MULTIPROC_DIR
before spawning the scheduler and serves the merged registry at `/metrics`. Metrics created in
the scheduler process therefore appear there, next to SGLang's own `sglang:*` series.
"""

from __future__ import annotations

import math
import os

from sgl_adaspec.scheduler.request_slo import CUSTOM_CLASS

PREFIX = "sglang_adaspec:"
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
TPOT_BUCKETS_MS = (1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000, 2000)
# A response's meta_info field: per output token, the tokens verified by the speculative
# iteration that committed it, at the iteration's first token (None elsewhere), as
# `request_state.record_verified` writes it.
VERIFIED_TOKENS_KEY = "adaspec_verified_tokens"


def verified_per_iteration(meta_info: dict) -> list[int]:
    """The tokens verified (root included) in each speculative iteration that served a
    response, in order, from its meta_info; empty where none did."""
    return [count for count in meta_info.get(VERIFIED_TOKENS_KEY) or () if count is not None]


def prometheus_slo_label(slo_class: str, tpot_slo_ms: float | None) -> str:
    """The `slo_class` label of a finished request: its class, except that a bare `tpot_slo_ms`
    (class `custom`) is labelled by the TPOT bucket its SLO falls in (`custom_le_50ms`: over
    the next lower edge, at most 50 ms; `custom_gt_2000ms` past the last edge), so numeric SLOs
    keep apart in at most 16 series."""
    if slo_class != CUSTOM_CLASS or tpot_slo_ms is None:
        return slo_class
    edge = next((ms for ms in TPOT_BUCKETS_MS if tpot_slo_ms <= ms), None)
    if edge is None:
        return f"{CUSTOM_CLASS}_gt_{TPOT_BUCKETS_MS[-1]}ms"
    return f"{CUSTOM_CLASS}_le_{edge}ms"


def metrics_enabled() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


class PrometheusSink:
    """Mirrors `SpecStats.observe_*` calls into Prometheus series (labels: slo_class). The
    per-class counters of `slo_classes` exist from the start, at 0: a rate over a window needs a
    series before a class's first request, and attainment needs "met" before its first met SLO.
    With `--dp N` (`dp_rank` given) every series also carries `dp_rank`, as SGLang's own do:
    one series per replica, their sum the server's total."""

    def __init__(self, slo_classes: tuple[str, ...] = (), dp_rank: int | None = None) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self._rank = () if dp_rank is None else (str(dp_rank),)
        rank = [] if dp_rank is None else ["dp_rank"]
        self.finished = Counter(
            f"{PREFIX}requests_finished", "Finished requests per SLO class", [*rank, "slo_class"]
        )
        self.met = Counter(
            f"{PREFIX}requests_slo_met", "Finished requests that met their TPOT SLO",
            [*rank, "slo_class"],
        )  # fmt: skip
        # In seconds, as SGLang's own sglang:request_time_per_output_token_seconds; the series
        # in ms stays for one release (deprecated: docker/prometheus/rules.yml still reads it).
        self.tpot_seconds = Histogram(
            f"{PREFIX}request_time_per_output_token_seconds",
            "Mean time per output token of finished requests (s)", [*rank, "slo_class"],
            buckets=tuple(ms / 1000 for ms in TPOT_BUCKETS_MS),
        )  # fmt: skip
        self.tpot = Histogram(
            f"{PREFIX}request_tpot_ms", "Deprecated: request_time_per_output_token_seconds (ms)",
            [*rank, "slo_class"], buckets=TPOT_BUCKETS_MS,
        )  # fmt: skip
        self.verified = Histogram(
            f"{PREFIX}verified_tokens_per_iteration",
            "Tokens sent to the target per speculative iteration (roots included)",
            rank, buckets=TOKEN_BUCKETS,
        )  # fmt: skip
        self.accepted = Counter(
            f"{PREFIX}accepted_tokens", "Tokens committed by verification (bonus included)", rank
        )
        self.verifies = Counter(
            f"{PREFIX}request_verifies", "Request verifications (one per request per iteration)",
            rank,
        )  # fmt: skip
        self.draft_rows = Counter(
            f"{PREFIX}draft_rows",
            "Rows of the draft's decode forwards (steps - 1) * requests * width",
            rank,
        )  # fmt: skip
        self.exited = Counter(
            f"{PREFIX}early_exit_tokens",
            "Draft tokens that left the verify pass early (token-wise early exit)",
            rank,
        )
        self.draft_accepted = Counter(
            f"{PREFIX}draft_tokens_accepted",
            "Accepted draft tokens (bonus excluded): predicted by the draft's raw path "
            "probabilities, by the calibrated ones, and observed",
            [*rank, "kind"],
        )
        self.plain = Counter(
            f"{PREFIX}plain_iterations",
            "Iterations run without speculation because no tree was worth its cost",
            rank,
        )
        self.shape = Gauge(
            f"{PREFIX}iteration_shape",
            "Last iteration's budget B, depth d and width w, and the shape the draft ran",
            [*rank, "parameter"], multiprocess_mode="mostrecent",
        )  # fmt: skip
        # The fleet view (`scheduler/slo_load.py`): the SLO load now, per class.
        now = {"multiprocess_mode": "mostrecent"}
        self.load_requests = Gauge(
            f"{PREFIX}slo_running_requests", "Requests decoding now per SLO class",
            [*rank, "slo_class"], **now,
        )  # fmt: skip
        self.load_behind = Gauge(
            f"{PREFIX}slo_running_behind",
            "Requests decoding now whose TPOT so far is over their SLO", [*rank, "slo_class"], **now,
        )  # fmt: skip
        self.load_tpot = Gauge(
            f"{PREFIX}slo_running_tpot_seconds",
            "Mean TPOT so far of the requests decoding now (s; NaN: none)", [*rank, "slo_class"],
            **now,
        )  # fmt: skip
        self.load_slo = Gauge(
            f"{PREFIX}slo_running_tpot_slo_seconds",
            "Tightest TPOT SLO of the requests decoding now (s; NaN: none)", [*rank, "slo_class"],
            **now,
        )  # fmt: skip
        self.load_predicted = Gauge(
            f"{PREFIX}predicted_tpot_seconds",
            "Per-token time predicted with `added` more requests than now (s)", [*rank, "added"],
            **now,
        )  # fmt: skip
        self.load_margin = Gauge(
            f"{PREFIX}slo_margin_seconds",
            "Tightest TPOT SLO in force less the per-token time with one more request (s; NaN: "
            "no SLO in force or no latency fit yet)", rank, **now,
        )  # fmt: skip
        self._load_labels = set(slo_classes)
        for slo_class in slo_classes:
            self._of(self.finished, slo_class)
            self._of(self.met, slo_class)
            self._of(self.load_requests, slo_class).set(0)
            self._of(self.load_behind, slo_class).set(0)

    def _of(self, metric, *labels: str):
        """The series of `metric` with these labels after this replica's `dp_rank`, if any."""
        values = (*self._rank, *labels)
        return metric.labels(*values) if values else metric

    def observe_iteration(self, verified, accepted, budget, depth, width) -> None:
        self._of(self.verified).observe(sum(verified))
        self._of(self.accepted).inc(sum(accepted))
        self._of(self.verifies).inc(len(verified))
        for name, value in (("budget", budget), ("depth", depth), ("width", width)):
            self._of(self.shape, name).set(value)

    def observe_draft(self, depth, width, rows) -> None:
        self._of(self.draft_rows).inc(rows)
        for name, value in (("draft_depth", depth), ("draft_width", width)):
            self._of(self.shape, name).set(value)

    def observe_calibration(self, raw, calibrated, observed) -> None:
        for kind, value in (("predicted", raw), ("calibrated", calibrated), ("observed", observed)):
            self._of(self.draft_accepted, kind).inc(max(value, 0.0))

    def observe_plain(self, num_requests) -> None:
        self._of(self.plain).inc()

    def observe_early_exit(self, tested, exited) -> None:
        self._of(self.exited).inc(exited)

    def observe_finished(
        self, slo_class: str, tpot_ms: float, met: bool, tpot_slo_ms: float | None = None
    ) -> None:
        slo_class = prometheus_slo_label(slo_class, tpot_slo_ms)
        self._of(self.finished, slo_class).inc()
        met_counter = self._of(self.met, slo_class)  # at 0 until the class first meets its SLO
        if met:
            met_counter.inc()
        self._of(self.tpot, slo_class).observe(tpot_ms)
        self._of(self.tpot_seconds, slo_class).observe(tpot_ms / 1000)

    def observe_slo_load(self, view: dict) -> None:
        """The fleet view of this scheduler (`slo_load.slo_load`); a class seen before and
        gone now reads 0 requests and NaN times."""
        classes = view.get("classes", {})
        self._load_labels.update(classes)
        for label in self._load_labels:
            entry = classes.get(label, {})
            self._of(self.load_requests, label).set(entry.get("requests", 0))
            self._of(self.load_behind, label).set(entry.get("behind", 0))
            self._of(self.load_tpot, label).set(_seconds(entry.get("tpot_now_ms")))
            self._of(self.load_slo, label).set(_seconds(entry.get("tpot_slo_ms")))
        for added, ms in enumerate(view.get("tpot_ms_added", ()), start=1):
            self._of(self.load_predicted, str(added)).set(_seconds(ms))
        self._of(self.load_margin).set(_seconds(view.get("margin_ms")))


def _seconds(ms: float | None) -> float:
    return math.nan if ms is None else ms / 1000
