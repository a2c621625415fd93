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
  by the draft forwards plus the verify pass.

SLO accounting (as the server's `speculative/sglang/`): a request's decode clock starts at the
start of its first decode iteration; TPOT = (finish - decode start) / (output tokens - 1), the
prefill's token excluded. It meets its SLO when TPOT <= its TPOT SLO. Queueing and prefill time
before the first decode iteration count toward TTFT only.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from sgl_adaspec.scheduler.slo import SloBatch
from sgl_adaspec.sim.acceptance import AcceptanceModel
from sgl_adaspec.sim.latency import LatencyModel
from sgl_adaspec.sim.policies import SimPolicy
from sgl_adaspec.sim.trees import accept_walk, draft_trees
from sgl_adaspec.sim.workload import WorkloadArrays


@dataclass(frozen=True)
class EngineConfig:
    max_running_requests: int = 128
    max_prefill_tokens: int = 8192  # SGLang's chunked-prefill size; longer prompts go alone
    # Safety stop (simulated seconds); a run that hits it raises instead of returning a partial.
    max_sim_time_s: float = 36_000.0

    def __post_init__(self) -> None:
        if self.max_running_requests < 1 or self.max_prefill_tokens < 1:
            raise ValueError("max_running_requests and max_prefill_tokens must be >= 1")


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
    """Per request [R] (workload order): first_token_s, decode_start_s, finish_s, committed
    (tokens generated), finished_count (times the request finished: must be 1), tpot_ms, met.
    Totals over the run: decode iterations, prefill batches, verified and accepted draft tokens,
    busy time in prefill / draft / verify (ms)."""

    policy: str
    workload: WorkloadArrays
    first_token_s: np.ndarray
    decode_start_s: np.ndarray
    finish_s: np.ndarray
    committed: np.ndarray
    finished_count: np.ndarray
    iterations: int = 0
    prefill_batches: int = 0
    request_iterations: int = 0
    verified_tokens: int = 0
    accepted_drafts: int = 0
    prefill_ms: float = 0.0
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    log: IterationLog | None = None

    @property
    def tpot_ms(self) -> np.ndarray:
        decoded = self.workload.output_tokens - 1
        return 1000.0 * (self.finish_s - self.decode_start_s) / decoded

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
    rng = np.random.default_rng(seed)
    num = workload.num_requests
    alpha_by_class, beta_by_class = acceptance.class_params(list(workload.class_names))
    alpha = alpha_by_class[workload.class_index]
    beta = beta_by_class[workload.class_index]
    prompt = workload.prompt_tokens
    tokens = np.zeros(num, dtype=np.int64)  # committed so far (prefill token included)
    result = SimResult(
        policy.name,
        workload,
        first_token_s=np.full(num, np.nan),
        decode_start_s=np.full(num, np.nan),
        finish_s=np.full(num, np.nan),
        committed=tokens,
        finished_count=np.zeros(num, dtype=np.int64),
        log=IterationLog() if record_iterations else None,
    )
    waiting: deque[int] = deque()
    running = np.empty(0, dtype=np.int64)
    next_arrival, done, now = 0, 0, 0.0
    while done < num:
        if now > config.max_sim_time_s:
            raise RuntimeError(
                f"simulation passed {config.max_sim_time_s} s with {num - done} requests left"
            )
        while next_arrival < num and workload.arrival_s[next_arrival] <= now:
            waiting.append(next_arrival)
            next_arrival += 1
        if not waiting and running.size == 0:
            now = float(workload.arrival_s[next_arrival])
            continue
        if waiting and running.size < config.max_running_requests:
            admitted = _admit(waiting, prompt, config.max_running_requests - running.size, config)
            elapsed_ms = latency.prefill_ms(int(prompt[admitted].sum()), policy.speculates)
            now += elapsed_ms / 1000.0
            result.prefill_ms += elapsed_ms
            result.prefill_batches += 1
            tokens[admitted] = 1
            result.first_token_s[admitted] = now
            running = np.concatenate([running, admitted])
            continue
        now, finished = _decode_iteration(
            running, now, workload, latency, acceptance, policy, rng, alpha, beta, tokens, result
        )
        if finished.any():
            gone = running[finished]
            result.finish_s[gone] = now
            result.finished_count[gone] += 1
            done += gone.size
            running = running[~finished]
    return result


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
) -> tuple[float, np.ndarray]:
    """One speculative (or plain) decode iteration of the running batch; returns the new clock
    and which running requests finished [n] bool."""
    start = result.decode_start_s[running]
    fresh = np.isnan(start)
    result.decode_start_s[running[fresh]] = now
    start = np.where(fresh, now, start)
    slo = SloBatch(
        tpot_slo_ms=torch.from_numpy(workload.tpot_slo_ms[running]),
        decode_elapsed_ms=torch.from_numpy(1000.0 * (now - start)),
        tokens_out=torch.from_numpy((tokens[running] - 1).astype(np.float64)),
    )

    def draft(depth: int, width: int):
        return draft_trees(acceptance, rng, alpha[running], beta[running], depth, width)

    context_lens = workload.prompt_tokens[running] + tokens[running]
    decision = policy.decide(slo, draft, tuple(str(i) for i in running), context_lens)
    if decision.trees is None:
        accepted, deepest = np.zeros(running.size, dtype=np.int64), None
    else:
        accepted, deepest = accept_walk(decision.trees, decision.selected, rng)
    context = int(context_lens.sum())
    draft_ms = sum(latency.draft_step_ms(t, context) for t in decision.draft_forward_tokens)
    verified = int(decision.verified.sum())
    verify_ms = latency.verify_ms(verified, context)
    elapsed_ms = draft_ms + verify_ms
    remaining = workload.output_tokens[running] - tokens[running]
    committed = np.minimum(accepted + 1, remaining)
    tokens[running] += committed
    policy.observe(decision, accepted, elapsed_ms, verify_ms, deepest)
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
    return now + elapsed_ms / 1000.0, tokens[running] >= workload.output_tokens[running]
