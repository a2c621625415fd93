"""Does SLO-aware dispatch help a tight class across data-parallel replicas? One run, one trace,
three servers with two replicas each (`--dp 2`, adaserve, one core per replica).

    python benchmarks/dp_dispatch.py [--pair bigram|smollm2] [--requests N] [--rate R]
                                     [--tight-share S] [--tight-slo X] [--repeats K] [--seed X]

The default pair is the tiny bigram pair: SmolLM2 with two replicas on one core each serves a
few tokens per second at a batch of 8 here, so a trace that loads it takes most of an hour.
Dispatch methods: SGLang's `--load-balance-method round_robin` and `total_requests`, and the
plugin's `--slo-dispatch on`. The trace: `--requests` arrivals, Poisson at `--rate` per second;
a `--tight-share` of them are tight (few tokens, TPOT SLO `--tight-slo` x the baseline), the
rest loose (many tokens, SLO `--loose-slo` x the baseline). The baseline is the median TPOT of
one request alone, measured first in the same run. Every method replays the same trace, open
loop, `--repeats` times, in a rotating order (a drift of the host's speed falls on all alike).
Per method: SLO attainment of the tight class, the loose class and overall, and median TPOT.
Last line: dp_slo_dispatch_tight_attainment_gain=<the tight class's attainment with
--slo-dispatch on, less the better of the two SGLang methods'>.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from sgl_adaspec.bench.prompts import BUILTIN_PROMPTS
from sgl_adaspec.local_server.client import stream_generate
from sgl_adaspec.local_server.launch import Server, eagle_flags

METHODS = {
    "round_robin": ("--load-balance-method", "round_robin"),
    "total_requests": ("--load-balance-method", "total_requests"),
    "slo": ("--slo-dispatch", "on"),
}
# One OpenMP thread per replica, each on its own core.
REPLICA_ENV = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1"}


@dataclass(frozen=True)
class Arrival:
    at_s: float
    tight: bool
    prompt: str


def make_trace(requests: int, rate: float, tight_share: float, seed: int) -> list[Arrival]:
    rng = random.Random(seed)
    at, trace = 0.0, []
    for i in range(requests):
        trace.append(
            Arrival(at, rng.random() < tight_share, BUILTIN_PROMPTS[i % len(BUILTIN_PROMPTS)])
        )
        at += rng.expovariate(rate)
    return trace


def replay(url: str, trace: list[Arrival], tokens: dict[bool, int], slos: dict[bool, float]):
    """(tight, TPOT ms) of every request, each sent at its arrival time."""
    start = time.perf_counter()

    def one(arrival: Arrival):
        time.sleep(max(0.0, start + arrival.at_s - time.perf_counter()))
        params = {"tpot_slo_ms": round(slos[arrival.tight], 3)}
        timing = stream_generate(
            url, arrival.prompt, tokens[arrival.tight], params, ignore_eos=True
        )
        return arrival.tight, timing.tpot_ms

    with ThreadPoolExecutor(len(trace)) as pool:
        return list(pool.map(one, trace))


def pair(name: str) -> tuple[Path, Path]:
    if name == "bigram":
        from sgl_adaspec.models.tiny import ensure_models

        models = ensure_models()
        return models.bigram_target, models.bigram_eagle_draft
    from sgl_adaspec.models.smollm2 import prepare_smollm2
    from sgl_adaspec.models.train_eagle import DEFAULT_EXPORT

    return prepare_smollm2(), DEFAULT_EXPORT


def attainment(results, slos: dict[bool, float], tight: bool | None = None) -> float:
    judged = [(t, ms) for t, ms in results if tight is None or t == tight]
    return sum(ms <= slos[t] for t, ms in judged) / len(judged) if judged else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="bigram", choices=("bigram", "smollm2"))
    parser.add_argument("--requests", type=int, default=36)
    parser.add_argument("--rate", type=float, default=1.0, help="arrivals per second")
    parser.add_argument("--tight-share", type=float, default=0.4)
    parser.add_argument("--tight-tokens", type=int, default=24)
    parser.add_argument("--loose-tokens", type=int, default=96)
    parser.add_argument("--tight-slo", type=float, default=2.5, help="x the baseline TPOT")
    parser.add_argument("--loose-slo", type=float, default=4.0, help="x the baseline TPOT")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    target, draft = pair(args.pair)
    spec = (*eagle_flags(draft, 4, 2, 8), "--spec-policy", "adaserve", "--dp", "2")
    logs = Path(tempfile.mkdtemp(prefix="dp_dispatch_"))
    trace = make_trace(args.requests, args.rate, args.tight_share, args.seed)
    tokens = {True: args.tight_tokens, False: args.loose_tokens}
    tight_count = sum(a.tight for a in trace)
    print(
        f"trace: {len(trace)} requests over {trace[-1].at_s:.1f} s, {tight_count} tight "
        f"({args.tight_tokens} tokens), {len(trace) - tight_count} loose ({args.loose_tokens} tokens)"
    )
    results = {method: [] for method in METHODS}
    with contextlib.ExitStack() as stack:
        servers = {
            method: stack.enter_context(
                Server(target, (*spec, *flags), env=REPLICA_ENV, log_path=logs / f"{method}.log")
            )
            for method, flags in METHODS.items()
        }
        for server in servers.values():  # warm-up: each replica's first requests
            with ThreadPoolExecutor(4) as pool:
                list(
                    pool.map(
                        partial(stream_generate, server.url, max_new_tokens=8), BUILTIN_PROMPTS[:4]
                    )
                )
        first = servers["round_robin"].url
        alone = [
            stream_generate(first, p, args.tight_tokens, ignore_eos=True).tpot_ms
            for p in BUILTIN_PROMPTS[:5]
        ]
        baseline = statistics.median(alone)
        slos = {True: args.tight_slo * baseline, False: args.loose_slo * baseline}
        print(
            f"baseline TPOT (one request alone) {baseline:.1f} ms: tight SLO {slos[True]:.1f} ms, "
            f"loose SLO {slos[False]:.1f} ms"
        )
        order = list(METHODS)
        for repeat in range(args.repeats):
            shift = repeat % len(order)
            for method in order[shift:] + order[:shift]:
                results[method] += replay(servers[method].url, trace, tokens, slos)
            print(f"round {repeat + 1}/{args.repeats} done", flush=True)

    print(f"\n{'method':<16}{'tight':>8}{'loose':>8}{'all':>8}{'tight TPOT':>12}{'loose TPOT':>12}")
    tight_att = {}
    for method, rs in results.items():
        tight_att[method] = attainment(rs, slos, True)
        med = {t: statistics.median(ms for tt, ms in rs if tt == t) for t in (True, False)}
        print(
            f"{method:<16}{tight_att[method]:>8.2f}{attainment(rs, slos, False):>8.2f}"
            f"{attainment(rs, slos):>8.2f}{med[True]:>12.1f}{med[False]:>12.1f}"
        )
    print(f"server logs: {logs}")
    gain = tight_att["slo"] - max(tight_att["round_robin"], tight_att["total_requests"])
    print(f"dp_slo_dispatch_tight_attainment_gain={gain:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
