"""The plugin's state in one scheduler process: built once when the scheduler starts, read by
every hook through `runtime()` / `current_policy()`; `/server_info` reports it."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from sgl_adaspec.adapters.dp import reporter_of_scheduler
from sgl_adaspec.adapters.speculative import fallbacks
from sgl_adaspec.adapters.speculative.deferred_topk import DeferredTopk
from sgl_adaspec.adapters.speculative.fallbacks import Fallback, fell_back
from sgl_adaspec.adapters.speculative.tier_states import (
    TierStates,
    build_tier_states,
    graph_counts,
)
from sgl_adaspec.adapters.speculative.tp_sync import TpSync, clock_rate, tp_sync_of_scheduler
from sgl_adaspec.config import AdaspecConfig
from sgl_adaspec.scheduler.cost_model import VerifyCostProfile, knee_budget
from sgl_adaspec.scheduler.replica_report import ReplicaReporter
from sgl_adaspec.speculative.decision_log import DecisionLog
from sgl_adaspec.speculative.draft_tiers import tier_shapes
from sgl_adaspec.speculative.driver import IterationDriver
from sgl_adaspec.speculative.metrics import PrometheusSink, metrics_enabled
from sgl_adaspec.speculative.policies import build_policy
from sgl_adaspec.speculative.policies.base import PolicyBase
from sgl_adaspec.speculative.stats import replicas_total

logger = logging.getLogger(__name__)


@dataclass
class LoopClock:
    """When the last decode iteration of this scheduler ended (None: the last forward was not
    a decode iteration). An iteration's cost includes the scheduler's work between it and the
    previous one (processing that result, preparing this batch): per token it is a large
    share of a small model's plain decode, and a policy weighing plain against speculative
    iterations must see it."""

    last_decode_end_s: float | None = None
    # 1.0 but in the test of ranks whose clocks disagree (`tp_sync.CLOCK_RATES_ENV`).
    rate: float = 1.0
    # The end of the decode iteration that prefills have interrupted since (None: none did),
    # and the requests of the last decode iteration: those still running waited for them.
    interrupted_s: float | None = None
    last_decode_rids: frozenset = frozenset()
    # Whether a speculative iteration has been timed: the first pays one-off set-up.
    speculated: bool = False

    def now(self) -> float:
        """The plugin's clock in seconds: every duration it measures is read here."""
        return self.rate * time.perf_counter()

    def interrupt(self) -> None:
        """A forward other than a decode iteration (a prefill) runs next."""
        if self.last_decode_end_s is not None:
            self.interrupted_s = self.last_decode_end_s
        self.last_decode_end_s = None

    def stall_ms(self, rids: frozenset, forward_start_s: float) -> float:
        """For the decode iteration of `rids` starting its forward at `forward_start_s`: the
        time since the last decode iteration ended that its requests running in both waited
        on other forwards (0 where no forward came between, or no request ran in both); the
        iteration's requests are kept for the next call."""
        since, self.interrupted_s = self.interrupted_s, None
        waited = since is not None and not rids.isdisjoint(self.last_decode_rids)
        self.last_decode_rids = rids
        return 1000.0 * max(forward_start_s - since, 0.0) if waited else 0.0

    def cycle_start(self, forward_start_s: float) -> float:
        """Where the iteration starting its forward at `forward_start_s` began."""
        last = self.last_decode_end_s
        return forward_start_s if last is None else min(last, forward_start_s)


@dataclass(frozen=True)
class Runtime:
    """The plugin's state in one scheduler process, built once when the scheduler starts
    (`scheduler_started`): the parsed flags, the policy (None for `static` or without an EAGLE
    v2 worker), the verify cost profile it was seeded with, the draft tiers built, and the TP
    group whose rank 0 decides for all (`tp_sync`)."""

    config: AdaspecConfig
    policy: PolicyBase | None = None
    cost_profile: VerifyCostProfile | None = None
    clock: LoopClock = field(default_factory=LoopClock)
    tp_sync: TpSync = field(default_factory=TpSync)
    # This replica's SLO report to the DP controller (`--slo-dispatch on`, TP rank 0 only),
    # carried in its load snapshots (`adapters/dp_transport.py`).
    reporter: ReplicaReporter | None = None
    # SGLang runtime states of the draft tiers, steps 0 (warm plain iterations) included; None:
    # the configured search always runs and plain iterations run cold.
    tiers: TierStates | None = None
    # Whether the running batch's draft top-k waits for its next draft (`deferred_topk`).
    deferred_topk: DeferredTopk = field(default_factory=DeferredTopk)
    # Every decided iteration, one JSON line each (`--spec-decision-log`, TP rank 0 only).
    decision_log: DecisionLog | None = None
    # What drives the policy through each iteration (None without a policy).
    driver: IterationDriver | None = None


_RUNTIME: Runtime | None = None


def runtime() -> Runtime | None:
    """This process's runtime, or None before the scheduler started (or outside one)."""
    return _RUNTIME


def build_runtime(config: AdaspecConfig, draft_worker, sync: TpSync | None = None) -> Runtime:
    """The policy, seeded with the verify cost profile measured on `draft_worker`'s target.
    Every rank of a TP group builds it (the profile's forward passes are collective), but only
    rank 0's decides and reports (`tp_sync`)."""
    sync = sync if sync is not None else TpSync()
    clock = LoopClock(rate=clock_rate(sync))
    if config.spec_policy == "static" or draft_worker is None:
        return Runtime(config, clock=clock, tp_sync=sync)
    # Every policy gets the verify cost profile: it seeds the latency model they plan with,
    # and adaserve's knee rule takes its budget there unless --adaserve-budget is set.
    profile = profile_verify_cost(draft_worker)
    budget = knee_budget(profile) if profile is not None else None
    policy = build_policy(config, budget)
    fallbacks.inject_faults(policy)
    if profile is not None:
        # The dummy verify forward runs at a short context; seed with context 0.
        policy.verify_latency.seed(
            [((tokens, 0), ms) for tokens, ms in zip(profile.tokens, profile.latency_ms)]
        )
    policy.stats.cost_profile = profile.as_dict() if profile is not None else None
    if metrics_enabled() and sync.leads:
        from sgl_adaspec.scheduler.request_slo import BEST_EFFORT

        classes = (*config.load_slo_config().classes, BEST_EFFORT)
        from sglang.srt.runtime_context import get_parallel

        policy.stats.sinks.append(PrometheusSink(classes, get_parallel().dp_rank))
        fallbacks.export_metrics()
    logger.info(
        "sgl_adaspec: %s policy: %s; verify cost profile %s",
        config.spec_policy,
        getattr(policy, "config", policy),
        policy.stats.cost_profile or "not available",
    )
    if sync.size > 1:
        logger.info(
            "sgl_adaspec: TP rank %d of %d: %s", sync.rank, sync.size,
            "decides for the group" if sync.leads else "follows rank 0's decisions",
        )  # fmt: skip
    reporter = reporter_of_scheduler(config, sync.leads, policy)
    tiers = build_tiers(config, draft_worker, policy, sync)
    if tiers is not None:
        policy.stats.draft_tiers = [list(shape) for shape in tiers.shapes]
    log = None
    if config.spec_decision_log and sync.leads:
        from sglang.srt.runtime_context import get_parallel

        log = DecisionLog(config.spec_decision_log, get_parallel().dp_rank or 0)
        logger.info("sgl_adaspec: writing every decided iteration to %s", log.path)
    driver = IterationDriver(policy, clock=clock.now, observe_lag=observe_lag(config, draft_worker))
    return Runtime(
        config, policy, profile, clock, sync, reporter, tiers, decision_log=log, driver=driver
    )


def observe_lag(config: AdaspecConfig, worker) -> int:
    """`--spec-observe-lag`; auto: 1 where SGLang launches the next iteration before this one's
    results are read (the overlap schedule on CUDA). Without the overlap schedule a lag would
    leave a finished request's last iteration unread when its response goes out."""
    if config.spec_observe_lag != "auto":
        return int(config.spec_observe_lag)
    server_args = getattr(worker, "server_args", None)
    overlap = not getattr(server_args, "disable_overlap_schedule", True)
    return int(overlap and str(getattr(server_args, "device", "")).startswith("cuda"))


def forget_request(policy: PolicyBase, rid: str) -> None:
    """A finished request leaves the policy, once the outcomes still waiting for it are taken."""
    state = runtime()
    driver = state.driver if state is not None else None
    (driver.forget if driver is not None else policy.forget)(rid)


def build_tiers(
    config: AdaspecConfig, worker, policy: PolicyBase, sync: TpSync
) -> TierStates | None:
    """The draft tiers this server runs, built on every rank (on CUDA their graph captures are
    collective): steps 0 for a policy that may keep the draft warm in plain iterations, and
    the load-adaptive tiers where `--draft-tiers on` and the device allows (see the flags)."""
    from sgl_adaspec.adapters.platform.cpu.attention import TorchMultiStepDraftBackend

    steps, topk = worker.speculative_num_steps, worker.topk
    warm_capable = type(policy).keep_draft_warm is not PolicyBase.keep_draft_warm
    shapes = tier_shapes(
        steps, topk, worker.speculative_num_draft_tokens, config.draft_tier_limit,
        policy.draft_widths(topk), plain=warm_capable,
    )  # fmt: skip
    draft_backend = worker._draft_worker.draft_attn_backend
    eager = isinstance(draft_backend, TorchMultiStepDraftBackend)
    on_cuda = str(worker.device).startswith("cuda")
    if config.draft_tiers == "off":
        path = "off (--draft-tiers off)"
        shapes = shapes[:1]
    elif eager or (on_cuda and config.gpu_draft_tiers == "on"):
        path = "eager, the plugin's torch draft attention" if eager else "CUDA graphs per tier"
    else:
        path = (
            f"off on {worker.device} (opt in with --gpu-draft-tiers on; not yet validated on "
            "a GPU): the configured search runs, the policy narrows what is verified"
            if on_cuda
            else f"off: draft attention {type(draft_backend).__name__} runs the configured search"
        )
        shapes = shapes[:1]
    if warm_capable and (0, topk) not in shapes:
        shapes = (*shapes, (0, topk))
    if len(shapes) == 1:
        logger.info("sgl_adaspec: draft tiers %s", path)
        return None
    tiers = build_tier_states(
        worker, shapes, config.draft_tier_memory_gb, lambda stop: bool(sync.value(stop)),
        time_cap_s=config.draft_tier_capture_s,
    )
    if tiers is not None:
        counts = {shape: graph_counts(state) for shape, state in tiers.states.items()}
        logger.info(
            "sgl_adaspec: draft tiers %s: %d SGLang runtime states (depth, width) %s, "
            "%d graphs (%s), %.2f GB of device memory for them",
            path, len(tiers.states), list(tiers.shapes),
            sum(sum(c.values()) for c in counts.values()),
            "; ".join(
                f"{d}x{w}: " + ", ".join(f"{name} {n}" for name, n in c.items() if n)
                for (d, w), c in counts.items()
                if any(c.values())
            ) or "none captured",
            tiers.memory_gb,
        )  # fmt: skip
    return tiers


def profile_verify_cost(worker, repeats: int = 3) -> VerifyCostProfile | None:
    """Time the target's verify pass (SGLang's own dummy TARGET_VERIFY forward) for batch sizes
    1, 2, 4, ... up to the running-request limit, i.e. bs * num_draft_tokens verified tokens.
    Returns None (and logs why) if this SGLang build cannot run the dummy forward."""
    try:
        model_runner = worker.target_worker.model_runner
        runner = model_runner.eager_runner
        ntok = model_runner.decode_num_tokens_per_req()
        max_bs = runner._eager_max_bs
        buffers = runner._alloc_dummy_decode_buffers(max_bs, num_tokens_per_req=ntok)
        sizes = sorted({min(2**i, max_bs) for i in range(max_bs.bit_length() + 1)})
        if len(sizes) < 2:
            logger.info("sgl_adaspec: one running request at most; no verify cost profile")
            return None
        latency = []
        for bs in sizes:
            runner._dummy_run(batch_size=bs, buffers=buffers)  # warm-up
            runs = []
            for _ in range(repeats):
                start = time.perf_counter()
                runner._dummy_run(batch_size=bs, buffers=buffers)
                runs.append(1000 * (time.perf_counter() - start))
            latency.append(sorted(runs)[len(runs) // 2])
        return VerifyCostProfile(tuple(bs * ntok for bs in sizes), tuple(latency))
    except Exception as exc:  # a profiling failure must not stop the server: no budget instead
        fell_back(Fallback.COST_PROFILE, exc)
        return None


def scheduler_started(_result, scheduler, *args, **kwargs) -> None:
    """AFTER `Scheduler.__init__`, the plugin's one hook there: read the flags once and build
    the runtime (policy, cost profile) before serving, once the target's model runner is
    complete."""
    global _RUNTIME
    config = AdaspecConfig.from_env()
    logger.info("sgl_adaspec: scheduler uses spec policy %s (%s)", config.spec_policy, config)
    draft_worker = getattr(scheduler, "draft_worker", None)
    if draft_worker is None or not hasattr(draft_worker, "target_worker"):
        draft_worker = None
    _RUNTIME = build_runtime(config, draft_worker, tp_sync_of_scheduler())


def now_s() -> float:
    """The plugin's clock (`LoopClock.now`), also before the runtime is built."""
    return _RUNTIME.clock.now() if _RUNTIME is not None else time.perf_counter()


def from_perf_counter(perf_counter_s: float) -> float:
    """A `time.perf_counter()` reading (SGLang's time stamps) on the plugin's clock."""
    rate = _RUNTIME.clock.rate if _RUNTIME is not None else 1.0
    return rate * perf_counter_s


def tp_sync() -> TpSync:
    """This scheduler's TP group (a one-rank `TpSync` before the runtime is built)."""
    return _RUNTIME.tp_sync if _RUNTIME is not None else TpSync()


def replica_reporter() -> ReplicaReporter | None:
    """This replica's SLO report to the DP controller, or None (see `Runtime.reporter`)."""
    return _RUNTIME.reporter if _RUNTIME is not None else None


def current_policy() -> PolicyBase | None:
    """The process's policy, or None (static, no EAGLE v2 worker, or before start-up)."""
    return _RUNTIME.policy if _RUNTIME is not None else None


def add_internal_state(_result, controller, state: dict) -> None:
    """AFTER `SchedulerInternalStateController._add_speculative`: `/server_info` shows the
    policy's state under internal_states[i]["adaspec"]."""
    state_of = runtime()
    policy = current_policy()
    config = state_of.config if state_of is not None else AdaspecConfig.from_env()
    scheduler = controller.scheduler
    pool_stats = scheduler.pool_stats_observer.get_pool_stats()
    from sgl_adaspec.adapters import fleet_view

    state["adaspec"] = {
        "spec_policy": config.spec_policy,
        "stats": policy.stats.as_dict() if policy is not None else None,
        "fallbacks": fallbacks.counts(),
        # KV slots held by requests now (radix-cached, evictable prefixes excluded), computed
        # on each call unlike the periodically published `sglang:num_used_tokens`.
        "kv_tokens_used": int(pool_stats.full_num_used),
        # The fleet view (`GET /adaspec/slo_load`).
        "slo_load": fleet_view.scheduler_view(
            policy, len(scheduler.running_batch.reqs), len(scheduler.waiting_queue)
        ),
    }


async def internal_states_with_total(original, tokenizer_manager) -> list[dict]:
    """AROUND `TokenizerManager.get_internal_state` (one state per data-parallel replica):
    under `--dp N` each replica's entry also carries the server's total over all replicas,
    `adaspec_total` (`stats.replicas_total`), so a reader need not know the replicas' order."""
    states = await original(tokenizer_manager)
    replica_stats = [
        s["adaspec"]["stats"] for s in states if (s.get("adaspec") or {}).get("stats") is not None
    ]
    if len(replica_stats) > 1:
        total = replicas_total(replica_stats)
        for state in states:
            state["adaspec_total"] = total
    return states


_WARNED: set[str] = set()


def warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        logger.warning(message)
