"""Discrete-event simulation of one serving instance: FCFS admission, prefill, speculative decode.

The clock jumps from one forward to the next (no overlap, one GPU stream, like SGLang without
overlap scheduling):
- arrivals join the waiting queue;
- prefill first (SGLang's default: a prefill batch runs whenever requests wait and the running
  batch has room): waiting requests are admitted in arrival order up to `max_running_requests`
  and `max_prefill_tokens` (at least one). The prefill forward produces each request's first
  output token; running requests make no progress meanwhile;
- otherwise one decode iteration of the whole running batch: the policy drafts and selects
  (`policies.py`), the accept walk (`trees.accept_walk`) decides what the target accepts, each
  request commits accepted + 1 (bonus) tokens, cut at its output length, and the clock advances
  by the draft forwards plus the verify pass;
- a plain iteration (a policy's depth 0) leaves its requests' draft state stale, as SGLang's
  steps-0 path does with the draft extend skipped, as the plugin runs it (zeroed top-k): their
  next draft's path probabilities are 0 and it accepts nothing (not after SGLang's own
  adaptive steps 0, which keeps the extend: `SimStep.warm_draft`).

SLO accounting (as the server's `adapters/speculative/`, and as a client and SGLang measure
TPOT): a request's clock starts at its first token, the prefill's; TPOT = (finish - first
token) / (output tokens - 1). It meets its SLO when TPOT <= its TPOT SLO. Queueing and its own
prefill count toward TTFT only; a wait for its first decode iteration behind other requests'
prefills (which run first) counts toward TPOT, as every later prefill it waits on does.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np
import torch

from sgl_adaspec.scheduler.slo import SloBatch
from sgl_adaspec.sim.acceptance import AcceptanceModel
from sgl_adaspec.sim.latency import LatencyModel
from sgl_adaspec.sim.policies import SimPolicy
from sgl_adaspec.sim.trees import accept_walk, draft_trees
from sgl_adaspec.sim.workload import WorkloadArrays

# The host's clock the policy's own time is read on (`EngineConfig.policy_time_scale`); tests
# replace it with a clock they advance.
host_clock = time.perf_counter
CRITICAL_PATH_CHARGES = (None, "decide", "past-draft")  # `EngineConfig.charge_critical_path`

@dataclass(frozen=True)
class EngineConfig:
    max_running_requests: int = 128
    max_prefill_tokens: int = 8192  # SGLang's chunked-prefill size; longer prompts go alone
    # Safety stop (simulated seconds); a run that hits it raises instead of returning a partial.
    max_sim_time_s: float = 36_000.0
    # The policy's own wall time per decode iteration (its decide and observe calls, measured
    # on this host) times this scale is charged to the simulated clock, as a server's scheduler
    # pays it on every iteration. 0: not charged (the default; results stay deterministic).
    policy_time_scale: float = 0.0
    # Charge only the policy's time between the draft and the verify (`decide`: the verify
    # cannot launch before it), not the plan before the draft nor `observe`, which under
    # SGLang's overlap scheduler run beside the device's work of the iteration before.
    # "decide": all of it; "past-draft": what outlasts the draft's device time, as a decision
    # that reads nothing of the device runs on the host while the draft's kernels run.
    charge_critical_path: str | None = None
    # With `charge_critical_path`: each decided iteration's decision charged at this many ms
    # (times the scale) in place of the host's measured time, so that a run is repeatable and
    # asks what a decision of that length would cost (`benchmarks/decision_budget.py`).
    decision_ms: float | None = None
    # Iterations an outcome waits before the policy takes it (`IterationDriver.observe_lag`):
    # None, 1 where only the critical path is charged (the overlap scheduler it assumes plans
    # the next iteration before this one's outcome is read), else 0.
    observe_lag: int | None = None

    @property
    def lag(self) -> int:
        if self.observe_lag is not None:
            return self.observe_lag
        return int(self.charge_critical_path is not None)

    def __post_init__(self) -> None:
        if self.max_running_requests < 1 or self.max_prefill_tokens < 1:
            raise ValueError("max_running_requests and max_prefill_tokens must be >= 1")
        if not self.policy_time_scale >= 0:
            raise ValueError(f"policy_time_scale must be >= 0, got {self.policy_time_scale}")
        if self.observe_lag not in (None, 0, 1):
            raise ValueError(f"observe_lag must be 0 or 1, got {self.observe_lag}")
        if self.charge_critical_path not in CRITICAL_PATH_CHARGES:
            raise ValueError(
                f"charge_critical_path must be one of {CRITICAL_PATH_CHARGES}, got "
                f"{self.charge_critical_path!r}"
            )
        check_decision_charge(self.decision_ms, self.charge_critical_path)


def check_decision_charge(
    decision_ms: float | None,
    charge_critical_path: str | None,
    names: tuple[str, str] = ("decision_ms", "charge_critical_path"),
) -> None:
    """A fixed decision charge is finite, >= 0 and on a critical path (`names`: how the caller
    calls the two settings in its errors)."""
    if decision_ms is None:
        return
    if not (math.isfinite(decision_ms) and decision_ms >= 0):
        raise ValueError(f"{names[0]} must be finite and >= 0, got {decision_ms}")
    if charge_critical_path is None:
        raise ValueError(f"{names[0]} needs {names[1]}")


@dataclass
class IterationLog:
    """Per decode iteration (kept when `record_iterations`): batch size, verified tokens,
    committed tokens, latency (ms)."""

    num_requests: list[int] = field(default_factory=list)
    verified: list[int] = field(default_factory=list)
    committed: list[int] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)


@dataclass
class SimResult:
    """Per request [R] (workload order): first_token_s (the prefill's token), finish_s,
    committed (tokens generated), finished_count (times the request finished: must be 1),
    draft_stale (its last decode iteration ran plain), draft_blind (prefilled without the
    draft), tpot_ms (from the first token to the last, over the tokens after the first: a
    client's and SGLang's TPOT, the wait for the first decode iteration included), met.
    Totals over the run: decode iterations, prefill batches, verified and accepted draft tokens,
    busy time in prefill / draft / verify / the policy's own calls where charged (ms)."""

    policy: str
    workload: WorkloadArrays
    first_token_s: np.ndarray
    finish_s: np.ndarray
    committed: np.ndarray
    finished_count: np.ndarray
    draft_stale: np.ndarray | None = None
    draft_blind: np.ndarray | None = None
    iterations: int = 0
    prefill_batches: int = 0
    request_iterations: int = 0
    verified_tokens: int = 0
    accepted_drafts: int = 0
    prefill_ms: float = 0.0
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    policy_ms: float = 0.0  # charged (`EngineConfig.policy_time_scale`)
    log: IterationLog | None = None

    def __post_init__(self) -> None:
        if self.draft_stale is None:
            self.draft_stale = np.zeros(self.committed.shape, dtype=bool)
        if self.draft_blind is None:
            self.draft_blind = np.zeros(self.committed.shape, dtype=bool)

    @property
    def tpot_ms(self) -> np.ndarray:
        decoded = self.workload.output_tokens - 1
        return 1000.0 * (self.finish_s - self.first_token_s) / decoded

    @property
    def met(self) -> np.ndarray:
        slo = self.workload.tpot_slo_ms
        return np.where(np.isnan(slo), True, self.tpot_ms <= slo)


def simulate(
    workload: WorkloadArrays,
    latency: LatencyModel,
    acceptance: AcceptanceModel,
    policy: SimPolicy,
    seed: int,
    config: EngineConfig = EngineConfig(),
    record_iterations: bool = False,
) -> SimResult:
    """Serve every request of `workload` to completion under `policy`; deterministic in `seed`."""
    return simulate_replicas(
        workload, latency, acceptance, [policy], None, seed, config, record_iterations
    )


# dispatch(instances, request) -> index of the instance that serves the request.
Dispatch = Callable[[list["Instance"], int], int]


def simulate_replicas(
    workload: WorkloadArrays,
    latency: LatencyModel,
    acceptance: AcceptanceModel,
    policies: list[SimPolicy],
    dispatch: Dispatch | None,
    seed: int,
    config: EngineConfig = EngineConfig(),
    record_iterations: bool = False,
) -> SimResult:
    """Serve `workload` on one instance per policy (data-parallel replicas, each its own
    clock), each arrival sent where `dispatch` says (one instance: `dispatch` unused). The
    result pools every instance's requests and totals; deterministic in `seed` (instance 0
    draws as a lone instance does)."""
    num = workload.num_requests
    result = SimResult(
        policies[0].name,
        workload,
        first_token_s=np.full(num, np.nan),
        finish_s=np.full(num, np.nan),
        committed=np.zeros(num, dtype=np.int64),  # committed so far (prefill token included)
        finished_count=np.zeros(num, dtype=np.int64),
        log=IterationLog() if record_iterations else None,
    )
    alpha_by_class, beta_by_class = acceptance.class_params(list(workload.class_names))
    instance = partial(
        Instance, workload=workload, latency=latency, acceptance=acceptance, config=config,
        result=result, alpha=alpha_by_class[workload.class_index],
        beta=beta_by_class[workload.class_index],
    )  # fmt: skip
    for policy in policies:
        if getattr(policy, "driver", None) is not None:
            policy.driver.observe_lag = config.lag
    instances = [
        instance(policy=policy, rng=np.random.default_rng(seed if k == 0 else [seed, k]))
        for k, policy in enumerate(policies)
    ]
    next_arrival, done = 0, 0
    while done < num:
        busy = [inst for inst in instances if inst.busy]
        step_at = min((inst.now for inst in busy), default=np.inf)
        if next_arrival < num and workload.arrival_s[next_arrival] <= step_at:
            target = (
                instances[0]
                if len(instances) == 1
                else instances[dispatch(instances, next_arrival)]
            )
            if not target.busy:  # an idle instance waits for its next request
                target.now = max(target.now, float(workload.arrival_s[next_arrival]))
            target.waiting.append(next_arrival)
            next_arrival += 1
            continue
        if step_at > config.max_sim_time_s:
            raise RuntimeError(
                f"simulation passed {config.max_sim_time_s} s with {num - done} requests left"
            )
        done += min(busy, key=lambda inst: inst.now).step()
    return result


@dataclass
class Instance:
    """One serving instance: its waiting queue, running batch and clock (the time its next
    forward can start). Request state lives in the shared `result` (by workload index)."""

    workload: WorkloadArrays
    latency: LatencyModel
    acceptance: AcceptanceModel
    policy: SimPolicy
    rng: np.random.Generator
    config: EngineConfig
    result: SimResult
    alpha: np.ndarray
    beta: np.ndarray
    waiting: deque = field(default_factory=deque)
    running: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    now: float = 0.0
    after_prefill: bool = True  # the last forward was a prefill (or none ran yet)
    stall_ms: float = 0.0  # prefill time since the last decode iteration, with requests running

    @property
    def busy(self) -> bool:
        return bool(self.waiting) or self.running.size > 0

    @property
    def requests(self) -> np.ndarray:
        """Workload indices of its requests in flight (running, then waiting)."""
        return np.concatenate([self.running, np.array(self.waiting, dtype=np.int64)])

    def step(self) -> int:
        """One forward: a prefill batch when requests wait and the batch has room, else a
        decode iteration; returns how many requests finished."""
        result, tokens, config = self.result, self.result.committed, self.config
        if self.waiting and self.running.size < config.max_running_requests:
            prompt = self.workload.prompt_tokens
            room = config.max_running_requests - self.running.size
            admitted = _admit(self.waiting, prompt, room, config)
            with_draft = self.policy.speculates and self.policy.draft_prefills(int(admitted.size))
            if self.policy.speculates and not with_draft:
                result.draft_blind[admitted] = True
            elapsed_ms = self.latency.prefill_ms(int(prompt[admitted].sum()), with_draft)
            self.now += elapsed_ms / 1000.0
            if self.running.size > 0:  # they wait for it
                self.stall_ms += elapsed_ms
            result.prefill_ms += elapsed_ms
            result.prefill_batches += 1
            tokens[admitted] = 1
            result.first_token_s[admitted] = self.now
            self.running = np.concatenate([self.running, admitted])
            self.after_prefill = True
            return 0
        self.now, finished = _decode_iteration(
            self.running, self.now, self.workload, self.latency, self.acceptance, self.policy,
            self.rng, self.alpha[self.running], self.beta[self.running], tokens, result,
            self.after_prefill, self.stall_ms, config.policy_time_scale,
            config.charge_critical_path, config.decision_ms,
        )  # fmt: skip
        self.after_prefill, self.stall_ms = False, 0.0
        if not finished.any():
            return 0
        gone = self.running[finished]
        result.finish_s[gone] = self.now
        result.finished_count[gone] += 1
        self.running = self.running[~finished]
        return int(gone.size)


def _admit(waiting: deque, prompt: np.ndarray, room: int, config: EngineConfig) -> np.ndarray:
    admitted, total = [], 0
    while waiting and len(admitted) < room:
        size = int(prompt[waiting[0]])
        if admitted and total + size > config.max_prefill_tokens:
            break
        admitted.append(waiting.popleft())
        total += size
    return np.array(admitted, dtype=np.int64)


def _decode_iteration(
    running: np.ndarray,
    now: float,
    workload: WorkloadArrays,
    latency: LatencyModel,
    acceptance: AcceptanceModel,
    policy: SimPolicy,
    rng: np.random.Generator,
    alpha: np.ndarray,
    beta: np.ndarray,
    tokens: np.ndarray,
    result: SimResult,
    after_prefill: bool,
    stall_ms: float = 0.0,
    policy_time_scale: float = 0.0,
    charge_critical_path: str | None = None,
    decision_ms: float | None = None,
) -> tuple[float, np.ndarray]:
    """One speculative (or plain) decode iteration of the running batch (alpha, beta [n]: the
    running requests' acceptance parameters; stall_ms: the prefills they waited on since their
    last iteration; policy_time_scale, charge_critical_path, decision_ms: `EngineConfig`'s);
    returns the new clock and which running requests finished [n] bool."""
    # Each request's SLO clock runs from its first token, as on the server (`track_requests`).
    start = result.first_token_s[running]
    slo = SloBatch(
        tpot_slo_ms=torch.from_numpy(workload.tpot_slo_ms[running]),
        decode_elapsed_ms=torch.from_numpy(1000.0 * (now - start)),
        tokens_out=torch.from_numpy((tokens[running] - 1).astype(np.float64)),
        draft_blind=torch.from_numpy(result.draft_blind[running]),
    )

    # As on the server: after a plain iteration that skipped the draft extend, and for life
    # after a prefill without the draft, a request's draft is blind.
    stale = result.draft_stale[running] | result.draft_blind[running]

    simulated_s = 0.0  # wall time of the simulator's own draft trees inside `decide`

    def draft(depth: int, width: int):
        nonlocal simulated_s
        started = host_clock()
        trees = draft_trees(acceptance, rng, alpha, beta, depth, width)
        simulated_s += host_clock() - started
        if stale.any():  # as on the server: path probabilities 0, nothing accepted
            trees = replace(
                trees,
                path_prob=np.where(stale[:, None], 0.0, trees.path_prob),
                accept_prob=np.where(stale[:, None], 0.0, trees.accept_prob),
            )
        return trees

    context_lens = workload.prompt_tokens[running] + tokens[running]
    decide_started = host_clock()
    step = policy.decide(slo, draft, tuple(str(i) for i in running), context_lens)
    # On a server the policy's decisions sit inside the iteration it times; its observe after.
    decide_ms = 1000.0 * (host_clock() - decide_started - simulated_s) * policy_time_scale
    if step.trees is None:
        accepted, deepest = np.zeros(running.size, dtype=np.int64), None
    else:
        accepted, deepest = accept_walk(step.trees, step.selected, rng)
    result.draft_stale[running] = step.trees is None and not step.warm_draft
    context = int(context_lens.sum())
    draft_ms = sum(latency.draft_step_ms(t, context) for t in step.draft_forward_tokens)
    if charge_critical_path is not None:
        if decision_ms is None:
            decide_ms = 1000.0 * getattr(policy, "critical_s", 0.0) * policy_time_scale
        else:  # charged where a decision ran: the iteration drafted
            decide_ms = (step.trees is not None) * decision_ms * policy_time_scale
        if charge_critical_path == "past-draft":
            decide_ms = max(decide_ms - draft_ms, 0.0)
    verified = int(step.verified.sum())
    verify_ms = latency.verify_ms(verified, context)
    elapsed_ms = draft_ms + verify_ms
    if policy_time_scale:
        elapsed_ms += decide_ms
    remaining = workload.output_tokens[running] - tokens[running]
    committed = np.minimum(accepted + 1, remaining)
    tokens[running] += committed
    observe_started = host_clock()
    accept_lens = accepted + 1  # bonus included, as SGLang's accept_lens
    policy.observe(step, accept_lens, elapsed_ms, verify_ms, deepest, after_prefill, stall_ms)
    observe_ms = 1000.0 * (host_clock() - observe_started) * policy_time_scale
    if charge_critical_path is not None:
        observe_ms = 0.0
    result.policy_ms += decide_ms + observe_ms
    result.iterations += 1
    result.request_iterations += running.size
    result.verified_tokens += verified
    result.accepted_drafts += int(accepted.sum())
    result.draft_ms += draft_ms
    result.verify_ms += verify_ms
    if result.log is not None:
        result.log.num_requests.append(int(running.size))
        result.log.verified.append(verified)
        result.log.committed.append(int(committed.sum()))
        result.log.latency_ms.append(elapsed_ms)
    if policy_time_scale:
        elapsed_ms += observe_ms
    return now + elapsed_ms / 1000.0, tokens[running] >= workload.output_tokens[running]
