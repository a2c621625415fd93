"""Speculation and SLO statistics of one server process, kept apart from the policy math.

Glossary: a request *meets* its SLO when its mean TPOT over decoding (decode time / tokens
committed after the first) is at most its TPOT SLO. *Verified tokens* of an iteration count
every node sent to the target, roots included; *accepted tokens* count what the iteration
commits, the bonus token included (SGLang's accept length).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

# Trials the calibration must have learned from before its predictions count in the settled
# ratio (`SpecStats.observe_calibration`): a few iterations of verified nodes at n = 8. Before
# them g is mostly its priors, and over the few speculative iterations of a server that mostly
# stands down those first verifies weigh on a decayed ratio for its whole run (SmolLM2 on the
# CPU, ~22 speculative iterations a run: 1.153 in one run of three).
CALIBRATION_WARMUP_TRIALS = 256
# The server's first speculative iterations whose wall times /server_info shows (the first is
# a warm-up: `Outcome.warm_up`).
FIRST_SPECULATIVE_REPORTED = 4


@dataclass
class ClassStats:
    finished: int = 0
    met: int = 0
    tpot_ms_sum: float = 0.0
    infeasible: int = 0  # finished requests whose SLO was unreachable even alone

    def as_dict(self) -> dict:
        return {
            "finished": self.finished,
            "met": self.met,
            "attainment": self.met / self.finished if self.finished else None,
            "mean_tpot_ms": self.tpot_ms_sum / self.finished if self.finished else None,
            "infeasible": self.infeasible,
        }


@dataclass
class SpecStats:
    iterations: int = 0
    verified_tokens: int = 0
    max_verified_tokens: int = 0  # most tokens any single iteration verified
    accepted_tokens: int = 0
    request_iterations: int = 0  # sum over iterations of the running requests
    last_budget: int | None = None
    last_depth: int | None = None
    last_width: int | None = None
    # What the draft ran: its last (depth, width) and the rows of all its decode forwards
    # (a tier of depth d and width w over n requests runs (d - 1) * n * w rows).
    last_draft_depth: int | None = None
    last_draft_width: int | None = None
    draft_rows: int = 0
    drafts: int = 0
    graph_drafts: int = 0  # drafts replayed from a captured graph (CUDA)
    decided_drafts: int = 0  # drafts whose verify the policy decided (the others: full tree)
    ragged_verifies: int = 0  # verify forwards of the kept nodes only (the torch backend's)
    extend_graph_replays: int = 0  # draft extends after a draft, replayed from a captured graph
    verify_graph_replays: int = 0  # target verifies after a draft, replayed from a captured graph
    # ADASPEC_COUNT_HOST_READS=1: host reads of device tensors between draft and verify, and
    # where the plugin made them ("file:line": count)
    host_reads_before_verify: int = 0
    host_read_sites: dict[str, int] = field(default_factory=dict)
    # Requests with the plugin's SLO state whose finish (or abort) is not yet reported.
    open_requests: int = 0
    # The (depth, width) tiers built at start-up (`sglang.tier_states`), steps 0 included, and
    # the draft iterations run in each ("depth x width").
    draft_tiers: list | None = None
    draft_iterations_by_shape: dict[str, int] = field(default_factory=dict)
    # Token-wise early exit in verification: draft tokens tested, and those that left the pass.
    exit_tested_tokens: int = 0
    exited_tokens: int = 0
    exit_test_ms: float = 0.0
    # Iterations run without speculation (the cost model found no tree worth its price), and
    # those of them that kept the draft's state (its extend ran: `PolicyBase.keep_draft_warm`).
    plain_iterations: int = 0
    warm_plain_iterations: int = 0
    # Why each speculative iteration of adaserve's cost rule ran: "planned" (the plan chose
    # it), "probe" (a stand-down's two probing drafts), "explore" (an exploring draft), "cold"
    # (the depth-1 chain that warms a stale draft when a plan starts speculating), "unplanned"
    # (no plan yet).
    speculation_reasons: dict[str, int] = field(default_factory=dict)
    # Requests prefilled without the draft (`PolicyBase.draft_prefills`): blind to it for life.
    blind_prefills: int = 0
    # Probes of a stand-down whose measured draft beat a plain decode: each cleared the track
    # record at its load (`AdaservePolicy._judge_probe`).
    probes_that_paid: int = 0
    # Drafts that first computed the top-k a warm plain iteration's extend left to them
    # (`sglang.deferred_topk`).
    deferred_topk_drafts: int = 0
    # Wall times of the server's first speculative iterations, ms: the first pays one-off
    # set-up and prices nothing (`Outcome.warm_up`); the others show what a steady one takes.
    first_speculative_ms: list[float] = field(default_factory=list)
    # Accepted draft tokens per verify (bonus excluded): predicted by the raw path
    # probabilities, by the calibrated ones, and observed; decayed sums (weight 0.98 per
    # iteration), so the ratios describe the recent past, after warm-up.
    predicted_raw: float = 0.0
    predicted_calibrated: float = 0.0
    observed_accepted: float = 0.0
    # Verified nodes whose outcome (on the accepted path or not) trained the calibration.
    calibration_trials: int = 0
    # The same, summed over every iteration whose prediction was made after
    # CALIBRATION_WARMUP_TRIALS trials: the whole run after warm-up, undecayed.
    settled_raw: float = 0.0
    settled_calibrated: float = 0.0
    settled_observed: float = 0.0
    settled_iterations: int = 0
    # The last plan of a cost-aware policy, built when read (`last_plan`).
    plan_report: Callable[[], dict] | None = field(default=None, repr=False)
    t_spec_ms: float | None = None
    baseline_tpot_ms: float | None = None
    cost_profile: dict | None = None
    classes: dict[str, ClassStats] = field(default_factory=dict)
    # Exporters mirroring every observation (e.g. metrics.PrometheusSink).
    sinks: list = field(default_factory=list, repr=False)

    @property
    def last_plan(self) -> dict | None:
        """The last plan of a cost-aware policy: what it chose and the figures behind it."""
        return None if self.plan_report is None else self.plan_report()

    def observe_iteration(
        self, verified: list[int], accepted: list[int], budget: int, depth: int, width: int
    ) -> None:
        self.iterations += 1
        self.request_iterations += len(verified)
        self.verified_tokens += sum(verified)
        self.max_verified_tokens = max(self.max_verified_tokens, sum(verified))
        self.accepted_tokens += sum(accepted)
        self.last_budget, self.last_depth, self.last_width = budget, depth, width
        for sink in self.sinks:
            sink.observe_iteration(verified, accepted, budget, depth, width)

    def observe_host_reads(self, count: int, sites: dict[str, int]) -> None:
        """One iteration's host reads of device tensors between its draft and verify."""
        self.host_reads_before_verify += count
        for site, n in sites.items():
            self.host_read_sites[site] = self.host_read_sites.get(site, 0) + n

    def observe_draft(
        self,
        depth: int,
        width: int,
        rows: int,
        replayed: bool = False,
        decided: bool = False,
        ragged: bool = False,
        extend_replayed: bool = False,
        verify_replayed: bool = False,
    ) -> None:
        """One draft of (depth, width) over `rows` draft rows; `replayed`: from a CUDA graph;
        `decided`: the policy chose what of it was verified; `ragged`: the verify forward ran
        on those nodes only; `extend_replayed` / `verify_replayed`: the draft extend / the target's
        verify after it was a graph replay."""
        self.drafts += 1
        self.graph_drafts += replayed
        self.decided_drafts += decided
        self.ragged_verifies += ragged
        self.extend_graph_replays += extend_replayed
        self.verify_graph_replays += verify_replayed
        self.draft_rows += rows
        self.last_draft_depth, self.last_draft_width = depth, width
        key = f"{depth}x{width}"
        self.draft_iterations_by_shape[key] = self.draft_iterations_by_shape.get(key, 0) + 1
        for sink in self.sinks:
            sink.observe_draft(depth, width, rows)

    def observe_calibration(self, raw: float, calibrated: float, observed: float) -> None:
        """One speculative iteration's predicted (raw, calibrated) and observed accepted draft
        tokens, summed over its requests."""
        decay = 0.98
        self.predicted_raw = decay * self.predicted_raw + raw
        self.predicted_calibrated = decay * self.predicted_calibrated + calibrated
        self.observed_accepted = decay * self.observed_accepted + observed
        if self.calibration_trials >= CALIBRATION_WARMUP_TRIALS:
            self.settled_raw += raw
            self.settled_calibrated += calibrated
            self.settled_observed += observed
            self.settled_iterations += 1
        for sink in self.sinks:
            sink.observe_calibration(raw, calibrated, observed)

    def observe_plain(self, num_requests: int, warm: bool = False) -> None:
        self.plain_iterations += 1
        self.warm_plain_iterations += warm
        for sink in self.sinks:
            sink.observe_plain(num_requests)

    def observe_early_exit(self, tested: int, exited: int, test_ms: float) -> None:
        self.exit_tested_tokens += tested
        self.exited_tokens += exited
        self.exit_test_ms += test_ms
        for sink in self.sinks:
            sink.observe_early_exit(tested, exited)

    def observe_finished(
        self, slo_class: str, tpot_ms: float, tpot_slo_ms: float | None, infeasible: bool = False
    ) -> None:
        stats = self.classes.setdefault(slo_class, ClassStats())
        stats.finished += 1
        stats.infeasible += infeasible
        stats.tpot_ms_sum += tpot_ms
        met = tpot_slo_ms is None or tpot_ms <= tpot_slo_ms
        stats.met += met
        for sink in self.sinks:
            sink.observe_finished(slo_class, tpot_ms, met, tpot_slo_ms)

    def observe_slo_load(self, view: dict) -> None:
        """The scheduler's fleet view (`scheduler/slo_load.py`), mirrored into the sinks."""
        for sink in self.sinks:
            sink.observe_slo_load(view)

    def observe_speculative_ms(self, iteration_ms: float) -> None:
        """A speculative iteration's wall time: the first `FIRST_SPECULATIVE_REPORTED` are kept."""
        if len(self.first_speculative_ms) < FIRST_SPECULATIVE_REPORTED:
            self.first_speculative_ms.append(iteration_ms)

    def as_dict(self) -> dict:
        per_verify = self.request_iterations or None
        return {
            "iterations": self.iterations,
            "verified_tokens_per_iteration": (
                self.verified_tokens / self.iterations if self.iterations else None
            ),
            "max_verified_tokens_per_iteration": self.max_verified_tokens,
            # Roots included: 1.0 means the policy verified no draft token at all.
            "verified_tokens_per_request": (
                self.verified_tokens / per_verify if per_verify else None
            ),
            "accepted_tokens_per_verify": (
                self.accepted_tokens / per_verify if per_verify else None
            ),
            "budget": self.last_budget,
            "depth": self.last_depth,
            "width": self.last_width,
            "draft_depth": self.last_draft_depth,
            "draft_width": self.last_draft_width,
            "draft_rows_per_iteration": self.draft_rows / self.drafts if self.drafts else None,
            "draft_tiers": self.draft_tiers,
            "drafts": self.drafts,
            "draft_graph_replays": self.graph_drafts,
            "decided_drafts": self.decided_drafts,
            "ragged_verifies": self.ragged_verifies,
            "extend_graph_replays": self.extend_graph_replays,
            "verify_graph_replays": self.verify_graph_replays,
            "host_reads_before_verify": self.host_reads_before_verify,
            "host_read_sites": dict(sorted(self.host_read_sites.items())),
            "open_requests": self.open_requests,
            "draft_iterations_by_shape": dict(sorted(self.draft_iterations_by_shape.items())),
            "exit_tested_tokens": self.exit_tested_tokens,
            "exited_tokens": self.exited_tokens,
            "exit_test_ms_per_token": (
                self.exit_test_ms / self.exit_tested_tokens if self.exit_tested_tokens else None
            ),
            # Of all verified draft tokens (roots excluded), the share that exited early.
            "exited_fraction": (
                self.exited_tokens / (self.verified_tokens - self.request_iterations)
                if self.verified_tokens > self.request_iterations
                else None
            ),
            "plain_iterations": self.plain_iterations,
            "warm_plain_iterations": self.warm_plain_iterations,
            "speculation_reasons": dict(sorted(self.speculation_reasons.items())),
            "blind_prefills": self.blind_prefills,
            "probes_that_paid": self.probes_that_paid,
            "deferred_topk_drafts": self.deferred_topk_drafts,
            "first_speculative_iteration_ms": [round(ms, 3) for ms in self.first_speculative_ms],
            # predicted / observed accepted draft tokens; 1.0 = calibrated (None: no data yet).
            "acceptance_predicted_over_observed": _ratio(
                self.predicted_raw, self.observed_accepted
            ),
            "acceptance_calibrated_over_observed": _ratio(
                self.predicted_calibrated, self.observed_accepted
            ),
            "calibration_trials": self.calibration_trials,
            # Over the whole run after the calibration's warm-up: the ratios, and the observed
            # accepted draft tokens and iterations behind them (noise >= ~1 / sqrt(tokens)).
            "settled_predicted_over_observed": _ratio(self.settled_raw, self.settled_observed),
            "settled_calibrated_over_observed": _ratio(
                self.settled_calibrated, self.settled_observed
            ),
            "settled_accepted_draft_tokens": round(self.settled_observed, 3),
            "settled_iterations": self.settled_iterations,
            "last_plan": self.last_plan,
            "t_spec_ms": self.t_spec_ms,
            "baseline_tpot_ms": self.baseline_tpot_ms,
            "cost_profile": self.cost_profile,
            "classes": {name: s.as_dict() for name, s in sorted(self.classes.items())},
        }


def replicas_total(replica_stats: list[dict]) -> dict:
    """The server's total over data-parallel replicas, from each replica's `SpecStats.as_dict()`:
    iterations and finished requests summed, per-class attainment and mean TPOT recomputed over
    all of the class's requests."""
    classes: dict[str, ClassStats] = {}
    for stats in replica_stats:
        for name, c in stats["classes"].items():
            total = classes.setdefault(name, ClassStats())
            total.finished += c["finished"]
            total.met += c["met"]
            total.infeasible += c["infeasible"]
            total.tpot_ms_sum += (c["mean_tpot_ms"] or 0.0) * c["finished"]
    return {
        "replicas": len(replica_stats),
        "iterations": sum(s["iterations"] for s in replica_stats),
        "plain_iterations": sum(s["plain_iterations"] for s in replica_stats),
        "classes": {name: c.as_dict() for name, c in sorted(classes.items())},
    }


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None
