"""Hand-built inputs and drivers for the adaserve tests: beams, gain tables, latency lines, SLO
batches, and policies seeded to stand down or to speculate."""

from __future__ import annotations

import math

import torch
from policy_inputs import iteration_input

from sgl_adaspec.scheduler.slo import SloBatch
from sgl_adaspec.speculative.adaserve.config import AdaserveConfig
from sgl_adaspec.speculative.adaserve.gain_table import ShapeGain
from sgl_adaspec.speculative.adaserve.modes import BLIND_AFTER
from sgl_adaspec.speculative.adaserve.planner import plan_shape
from sgl_adaspec.speculative.adaserve.policy import AdaservePolicy
from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.policies.base import make_outcome


def linear_ms(fixed: float, per_token: float):
    """verify_ms(tokens, context) = fixed + per_token * (tokens - 1)."""
    return lambda tokens, context=0: (
        fixed + per_token * (torch.as_tensor(tokens, dtype=torch.float64) - 1)
    )


def free_draft(steps, rows=1):
    return torch.zeros_like(torch.as_tensor(steps, dtype=torch.float64))


def beam(f_by_request: list[list[list[float]]]) -> Candidates:
    """A beam per request in level layout: f_by_request[r][level] lists that level's nodes'
    f (the same count at every level, best first); node i of a level hangs under node i of
    the level above."""
    tokens, parents, probs = [], [], []
    for levels in f_by_request:
        width = len(levels[0])
        parents.append(
            [
                -1 if lvl == 0 else (lvl - 1) * width + i
                for lvl in range(len(levels))
                for i in range(width)
            ]
        )
        probs.append([f for level in levels for f in level])
        tokens.append(list(range(len(probs[-1]))))
    return Candidates(
        tokens=torch.tensor(tokens), parents=torch.tensor(parents),
        path_prob=torch.tensor(probs, dtype=torch.float64),
        valid=torch.ones(len(tokens), len(tokens[0]), dtype=torch.bool),
    )  # fmt: skip


def flat_gain(per_node: float, depth: int, width: int, requests: int = 1) -> ShapeGain:
    """Every node of a depth x width beam has f = per_node: a shape's k best give per_node * k."""
    gain = ShapeGain(max_nodes=16)
    gain.observe(beam([[[per_node] * width] * depth] * requests), depth, width)
    gain.refresh(lambda f: f)
    return gain


def slo(
    tpot_ms: list[float], elapsed_ms: list[float] | None = None, tokens: list[float] | None = None
):
    n = len(tpot_ms)
    return SloBatch(
        torch.tensor(tpot_ms, dtype=torch.float64),
        torch.tensor(elapsed_ms or [0.0] * n, dtype=torch.float64),
        torch.tensor(tokens or [0.0] * n, dtype=torch.float64),
    )


def plan(gain, requests, verify, draft=free_draft, **kw):
    """The plan with a plain decode priced as a one-token-per-request verify unless given."""
    plain_ms = kw.pop("plain_ms", None) or float(verify(requests, 0))
    return plan_shape(
        slo=kw.pop("batch", None) or slo([math.nan] * requests), context_tokens=0, gain=gain,
        verify_ms=verify, draft_ms=draft, plain_ms=plain_ms, **kw,
    )  # fmt: skip


def drafted(policy, num_requests, steps, topk, slo_batch):
    """The policy's draft shape as the server adapter asks it: a plain one (depth 0) is then
    asked whether it keeps the draft's state, and goes stale where not (as the observe of that
    iteration's outcome would record; these tests feed no outcome)."""
    shape = policy.draft_shape(num_requests, steps, topk, slo_batch)
    if shape[0] == 0 and not policy.keep_draft_warm():
        policy.draft_state = policy.draft_state.observed(warm=False)
    return shape


def feed(
    policy: AdaservePolicy,
    verify_ms: float,
    iteration_ms: float,
    accepted: int,
    requests: int = 1,
    after_prefill: bool = False,
    draft_kept: bool = False,
) -> None:
    """One plain iteration (no decision: verified 1 token each) of `requests` requests."""
    outcome = make_outcome(
        None, None, rids=tuple(f"r{i}" for i in range(requests)), context_tokens=10 * requests,
        accepted=torch.full((requests,), accepted), verify_ms=verify_ms, iteration_ms=iteration_ms,
        after_prefill=after_prefill, draft_kept=draft_kept,
    )  # fmt: skip
    policy.observe(outcome)


def standing_down_policy(probe_interval: int) -> AdaservePolicy:
    """Measured: plain 10 ms; a speculative iteration (draft 2-8 ms + verify) does not pay."""
    policy = AdaservePolicy(AdaserveConfig(probe_interval=probe_interval))
    policy.verify_latency.seed([((1, 10), 10.0), ((8, 10), 80.0)])
    policy.plain_latency.seed([((1, 10), 10.0), ((2, 10), 10.0)])
    policy.gain = flat_gain(0.5, 4, 2)
    policy.draft_latency.seed([((1, 1), 2.0), ((4, 7), 8.0)])
    return policy


def speculating_policy(config: AdaserveConfig) -> AdaservePolicy:
    policy = AdaservePolicy(config)
    policy.verify_latency.seed([((1, 10), 10.0), ((3, 10), 10.0)])  # verify is flat
    policy.plain_latency.seed([((1, 10), 10.0)])
    policy.draft_latency.seed([((1, 1), 1.0), ((4, 7), 4.0)])  # 1 ms per step
    # The chain is as good as the tree and 2 deep is where the rate peaks: (1 + 1.6) / 12.
    gain = ShapeGain(max_nodes=8)
    gain.observe(beam([[[0.8, 0.0], [0.8, 0.0], [0.05, 0.0], [0.05, 0.0]]]), 4, 2)
    gain.refresh(lambda f: f)
    policy.gain = gain
    return policy


def observe_drafts(policy, requests: int, drafts) -> None:
    """Speculative iterations of `requests` requests whose every beam node has f = 0.5, each
    (steps, width, draft ms) with a 10 ms verify that accepted every node of the chain."""
    for steps, width, draft_ms in drafts:
        beams = beam([[[0.5] * width] * steps] * requests)
        it = iteration_input(beams, steps, width, context_len=10)
        policy.observe(
            make_outcome(
                it, policy.decide(it), rids=it.rids, context_tokens=10 * requests,
                accepted=torch.full((requests,), steps + 1), verify_ms=10.0,
                iteration_ms=10.0 + draft_ms,
            )
        )  # fmt: skip


def measured_plain(policy, times: int, ms: float = 10.0):
    """`policy` with `times` more plain iterations measured at one request, at `ms`."""
    policy.plain_latency.seed([((1, 10), ms)] * times)
    return policy


def verified_outcome(it, decision, accepted: int, width: int = 1):
    """The outcome of one request's verify of a `beam` of that width that accepted `accepted`
    draft tokens, the first-ranked node of each level."""
    deepest = torch.tensor([(accepted - 1) * width if accepted else -1])
    return make_outcome(
        it, decision, rids=("r",), context_tokens=10, accepted=torch.tensor([accepted + 1]),
        verify_ms=10.0, iteration_ms=12.0, deepest_accepted=deepest,
    )  # fmt: skip


def stand_down(policy: AdaservePolicy) -> None:
    """Drafts decided at one request for as long as `draft_prefills` asks the plan to stand
    down before it blinds new requests; the plan must choose a plain decode in each."""
    for _ in range(BLIND_AFTER * policy.config.probe_interval):
        policy.draft_shape(1, 4, 2, slo([math.nan]))
        assert policy._running_plan is None


def plain_outcome(warm: bool, iteration_ms: float = 9.0):
    return make_outcome(
        None, None, rids=("r0",), context_tokens=0, accepted=torch.ones(1),
        verify_ms=iteration_ms - 1.0, iteration_ms=iteration_ms, draft_kept=warm,
    )  # fmt: skip


def stood_down_by_its_record(ratio: float) -> AdaservePolicy:
    """A policy whose plan would speculate (a 2 x 1 chain at ~2.2x a plain decode's tokens per
    ms) but whose track record at one request, formed by plans that delivered `ratio` of their
    prediction, asks every plan for more: it stands down."""
    policy = speculating_policy(AdaserveConfig())
    for _ in range(4):
        policy.record_at(1).observe(2.0, 10.0, 2.0 * ratio, 10.0)
    assert policy._cost_plan(slo([math.nan])).depth == 0
    return policy


def run_probe(policy, committed: int, iteration_ms: float) -> list[tuple[int, int]]:
    """Plain iterations until the stand-down probes, then the probe's two drafts, each
    committing `committed` tokens in `iteration_ms`; returns the shapes the probe drafted."""
    one = slo([math.nan])
    for _ in range(10 * policy.config.probe_interval):
        shape = drafted(policy, 1, 4, 2, one)
        if shape[0] > 0:
            break
        plain = make_outcome(
            None, None, rids=("r0",), context_tokens=10, accepted=torch.tensor([1]),
            verify_ms=9.0, iteration_ms=10.0,
        )  # fmt: skip
        policy.observe(plain)
    shapes = []
    for _ in range(2):
        if shapes:
            shape = drafted(policy, 1, 4, 2, one)
        shapes.append(shape)
        it = iteration_input(beam([[[0.5] * shape[1]] * shape[0]]), *shape, context_len=10)
        policy.observe(
            make_outcome(
                it, policy.decide(it), rids=it.rids, context_tokens=10,
                accepted=torch.tensor([committed]), verify_ms=8.0, iteration_ms=iteration_ms,
            )
        )  # fmt: skip
    return shapes


def reranked_tree(rng, requests: int, depth: int, width: int, nodes: int) -> Candidates:
    """SGLang's verify trees of a depth x width draft (an EAGLE draft with topk = width): each
    step expands the kept frontier to its `width` best children and keeps the level's `width`
    best; the tree is the `nodes` best of every node expanded, in expansion order, so it also
    holds leaves the beam did not keep. f falls along each path (random draft probabilities)."""
    tokens, parents, probs = [], [], []
    for _ in range(requests):
        expanded = []  # (f, parent's index into expanded or -1)
        frontier = [(1.0, -1)]
        for _ in range(depth):
            level = []
            for f, at in frontier:
                step = sorted((rng.uniform(0.0, 1.0) for _ in range(width)), reverse=True)
                level += [(f * p, at) for p in step]
            start = len(expanded)
            expanded += level
            best = sorted(range(len(level)), key=lambda i: -level[i][0])[:width]
            frontier = [(level[i][0], start + i) for i in sorted(best)]
        chosen = sorted(sorted(range(len(expanded)), key=lambda i: -expanded[i][0])[:nodes])
        index = {node: i for i, node in enumerate(chosen)}
        parents.append([-1 if expanded[i][1] < 0 else index[expanded[i][1]] for i in chosen])
        probs.append([expanded[i][0] for i in chosen])
        tokens.append(chosen)
    return Candidates(
        tokens=torch.tensor(tokens), parents=torch.tensor(parents),
        path_prob=torch.tensor(probs, dtype=torch.float32),
        valid=torch.ones(requests, nodes, dtype=torch.bool),
    )  # fmt: skip
