"""Does adaserve keep the promise on this machine: no request served worse than without
speculation, and speculation where it pays? One run, same prompts, one server at a time.

    python benchmarks/cost_aware.py [--loads 1,4,8] [--tokens N] [--repeats R] [--warmup W]
                                    [--min-batches K] [--server-sets S] [--pairs P,...]

Configurations: no speculation, static EAGLE (`--spec-policy static`), tetris and adaserve (its
default cost rule), each with EAGLE steps 4, topk 2, 8 draft tokens. Pairs: SmolLM2-135M-Instruct
+ the committed EAGLE draft (a draft that rarely pays on a CPU), the tiny bigram pair (its draft
is always right, but its 1-layer target's forward is cheaper than SGLang's own work around a
speculative iteration), and the deep bigram (`tiny-bigram-deep`: the same tokens at the forward
cost of a 49-layer model, where the target's forward outweighs that work, as a large model's
does). `--warmup` rounds (default 1) run first and are not counted; adaserve's TPOT over no
speculation's in them (a fresh server's) is printed apart. At each load n, n built-in prompts
are streamed at once with mixed classes (coding, chat, summarization in turn); each request
carries its TPOT SLO in ms, resolved from the classes of `sgl_adaspec/data/slo_classes.yaml`
with the baseline = no speculation's median TPOT at that load, measured first in the same run
(absolute classes below the baseline are out of reach and left out of the attainment). Per
configuration and load: median TPOT over all requests of `--repeats` rounds, each with at least
as many requests per load as the largest load has (one request alone gives one TPOT per batch)
and at least `--min-batches` batches per load (a batch's requests share one draw of the host's
speed, so a load run as one batch per round rests on one sample per round), and SLO
attainment, then every request that missed its SLO (class, TPOT over the SLO, accept length,
which of its iterations speculated and what they verified);
adaserve / none is also printed as the median over rounds of each round's ratio (a
round's batches run minutes apart at most). The rounds run on `--server-sets` (default 3) fresh
sets of the four servers, one set after another, each with its `--warmup` rounds and
`--repeats` counted ones (default 1): on this host identical servers without speculation, side
by side, differed by 3-18 % in median TPOT over a run (docs/results.md), so a ratio of two
processes is a draw of that too, and each configuration gets one draw per set. Within a set
the four servers run side by side and the batches interleave (see `interleaved`: no
speculation's and adaserve's alternate batch by batch, in ABBA order), so the ratios compare
like with like.
Last line:
adaserve_tpot_over_nospec_max=<max over loads of adaserve / no speculation median TPOT, SmolLM2>.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import requests

from sgl_adaspec.bench.batch_loads import builtin_prompts
from sgl_adaspec.demo import class_slos_ms, speculation_reasons
from sgl_adaspec.local_server.client import stream_generate
from sgl_adaspec.local_server.launch import Server, eagle_flags
from sgl_adaspec.speculative.metrics import verified_per_iteration

CLASSES = ("coding", "chat", "summarization")
CONFIGS = {
    "none": (),
    "static": ("--spec-policy", "static"),
    "tetris": ("--spec-policy", "tetris"),
    "adaserve": ("--spec-policy", "adaserve"),
}


def pair(name: str) -> tuple[Path, Path]:
    if name in ("bigram", "bigram-deep"):
        from sgl_adaspec.models.tiny import ensure_models

        models = ensure_models()
        target = models.bigram_target if name == "bigram" else models.deep_bigram_target
        return target, models.bigram_eagle_draft
    from sgl_adaspec.models.smollm2 import prepare_smollm2
    from sgl_adaspec.models.train_eagle import DEFAULT_EXPORT

    return prepare_smollm2(), DEFAULT_EXPORT


class Served(NamedTuple):
    """One request's class, TPOT, tokens committed per verify pass (SGLang's accept length:
    1.0 for a request served without speculation), verify passes, and the tokens verified in
    each speculative iteration that served it (adaserve's and tetris's; empty otherwise)."""

    cls: str
    tpot_ms: float
    accept_length: float
    verify_passes: int
    verified: tuple[int, ...]


def run_batch(url: str, texts: list[str], tokens: int, slos: dict[str, float] | None):
    """`Served` of each request of one batch sent at once."""
    jobs = [(CLASSES[i % len(CLASSES)], text) for i, text in enumerate(texts)]

    def one(job):
        cls, text = job
        params = {"tpot_slo_ms": round(slos[cls], 3)} if slos else None
        # ignore_eos: every request decodes `tokens` tokens, so each has a TPOT.
        timing = stream_generate(url, text, tokens, params, ignore_eos=True)
        meta = timing.meta_info
        return Served(
            cls,
            timing.tpot_ms,
            meta.get("spec_accept_length", 1.0),
            meta.get("spec_verify_ct", 0),
            tuple(verified_per_iteration(meta)),
        )

    with ThreadPoolExecutor(len(jobs)) as pool:
        return list(pool.map(one, jobs))


def slos_of(baseline: list) -> dict[str, float]:
    """The SLO classes' TPOT SLOs from no speculation's median TPOT at a load so far."""
    return class_slos_ms(statistics.median(r.tpot_ms for r in baseline))


def interleaved(servers: dict[str, Server], loads, texts, tokens, repeats, warmup=1, min_batches=1):
    """Per configuration and load: every request's `Served`. All servers are up at once
    (each sleeps when idle), and each round runs every configuration's batches back to back, so
    a drift of the host's speed (they reach 20 % on this machine within minutes) falls on all of
    them alike; no speculation's and adaserve's alternate batch by batch. The SLOs the others'
    requests carry come from no speculation's median TPOT at that load so far. The first
    `warmup` rounds are not counted: a server's first requests pay its set-up, and adaserve's
    its learning of what speculation returns here (its cold start is reported apart)."""
    out = {config: {n: [] for n in loads} for config in servers}
    cold = {config: {n: [] for n in loads} for config in ("none", "adaserve")}
    # Counted rounds' median TPOT per configuration and load, for the paired ratios.
    rounds = {config: {n: [] for n in loads} for config in servers}
    for server in servers.values():
        stream_generate(server.url, texts[0], 4)  # warm-up
    others = [c for c in servers if c != "none"]
    for round_ in range(warmup + repeats):
        for n in loads:
            # Every load gets as many requests per round as the largest: one request alone
            # gives one TPOT per batch, too few for a median on a host this noisy. And at
            # least `min_batches` batches: one batch's requests share one draw of its speed.
            batches = max(min_batches, -(-max(loads) // n))
            if round_ == warmup:  # counted rounds: no speculation's own baseline from here on
                cold["none"][n], out["none"][n] = out["none"][n], []
            # No speculation's and adaserve's batches alternate, one each in turn, so the
            # ratio the last line reports pairs batches seconds apart; the others follow.
            # Which of the two goes first alternates from one batch to the next (ABBA), so a
            # host slowing down or speeding up through a round favours neither.
            results = {config: [] for config in servers}
            for batch in range(batches):
                adaserve_first = bool(out["none"][n]) and (round_ + batch) % 2 == 1
                for config in ("adaserve", "none") if adaserve_first else ("none", "adaserve"):
                    slos = slos_of(out["none"][n]) if config == "adaserve" else None
                    results[config] += run_batch(servers[config].url, texts[:n], tokens, slos)
                    if config == "none":
                        out["none"][n] += results["none"][-n:]
            slos = slos_of(out["none"][n])
            rest = [c for c in others if c != "adaserve"]
            shift = round_ % len(rest) if rest else 0
            for config in rest[shift:] + rest[:shift]:
                results[config] = batches_of(servers[config].url, texts[:n], tokens, slos, batches)
            for config in others:
                if round_ >= warmup:
                    out[config][n] += results[config]
                elif config == "adaserve":
                    cold["adaserve"][n] += results[config]
            if round_ >= warmup:
                for config in servers:
                    rounds[config][n].append(statistics.median(r.tpot_ms for r in results[config]))
        print(f"round {round_ + 1}/{warmup + repeats} done", flush=True)
    return out, cold, rounds


def batches_of(url: str, texts: list[str], tokens: int, slos, batches: int):
    """`run_batch` `batches` times back to back: every request's `Served`."""
    return [result for _ in range(batches) for result in run_batch(url, texts, tokens, slos)]


def _fixed(value: float | None, digits: int) -> str:
    """A statistic with `digits` decimals; "-" where the server has none (never speculated)."""
    return "-" if value is None else f"{value:.{digits}f}"


def choices(server: Server) -> str:
    """What adaserve chose over the run, from its /server_info statistics."""
    info = requests.get(f"{server.url}/server_info", timeout=30).json()
    stats = info["internal_states"][0]["adaspec"]["stats"]
    calibrated = stats["acceptance_calibrated_over_observed"]
    settled = stats["settled_calibrated_over_observed"]
    return (
        f"{stats['plain_iterations']} iterations without speculation "
        f"({stats['warm_plain_iterations']} of them with the draft kept warm), "
        f"{stats['iterations']} speculative (by reason: {speculation_reasons(stats)}; "
        f"{_fixed(stats['accepted_tokens_per_verify'], 2)} tokens committed per verify; "
        f"calibrated / observed accepted draft tokens "
        f"{_fixed(calibrated, 3)} decayed, {_fixed(settled, 3)} after warm-up over "
        f"{_fixed(stats['settled_accepted_draft_tokens'], 0)} accepted draft tokens); "
        f"last plan {stats['last_plan']}"
    )


def judged(results, slos: dict[str, float], baseline_ms: float) -> list[Served]:
    """The requests whose class's SLO is within reach (at or above the baseline TPOT)."""
    return [r for r in results if slos[r.cls] >= baseline_ms]


def attainment(results, slos: dict[str, float], baseline_ms: float) -> float | None:
    counted = judged(results, slos, baseline_ms)
    return sum(r.tpot_ms <= slos[r.cls] for r in counted) / len(counted) if counted else None


def misses(results, slos: dict[str, float], baseline_ms: float) -> list[str]:
    """Each judged request over its SLO: class, TPOT / SLO, accept length and how many of its
    iterations speculated."""
    return [
        f"{r.cls} {r.tpot_ms / slos[r.cls]:.2f}x SLO (accept length {r.accept_length:.2f}; "
        f"{speculated(r)})"
        for r in judged(results, slos, baseline_ms)
        if r.tpot_ms > slos[r.cls]
    ]


def speculated(served: Served) -> str:
    """How many of a request's iterations speculated, and how many tokens they verified."""
    if not served.verified:
        return "no speculative iteration reported"
    verified = "+".join(str(count) for count in served.verified)
    return f"{len(served.verified)} of {served.verify_passes} iterations speculative, {verified}"


def run_pair(
    name: str, loads, tokens, repeats, warmup, min_batches, server_sets, logs: Path
) -> dict[str, dict[int, float]]:
    """Median TPOT per configuration and load; prints the pair's table."""
    target, draft = pair(name)
    texts = builtin_prompts(max(loads))
    spec = eagle_flags(draft, 4, 2, 8)
    results, cold, rounds = {}, {}, {}
    for index in range(server_sets):
        # A fresh set of processes: identical servers differed by 3-18 % in speed over a run on
        # this host, so every configuration gets as many draws of that as there are sets.
        servers = {
            config: Server(
                target,
                (*spec, *flags) if flags else (),
                log_path=logs / f"{name}-{config}-set{index + 1}.log",
            )
            for config, flags in CONFIGS.items()
        }
        with contextlib.ExitStack() as stack:
            for server in servers.values():
                stack.enter_context(server)
            measured = interleaved(servers, loads, texts, tokens, repeats, warmup, min_batches)
            print(
                f"{name} adaserve (set {index + 1}/{server_sets}): {choices(servers['adaserve'])}"
            )
        for merged, part in zip((results, cold, rounds), measured):
            for config, by_load in part.items():
                for n, values in by_load.items():
                    merged.setdefault(config, {}).setdefault(n, []).extend(values)
    if warmup:
        cold_tpot = {
            c: {n: statistics.median(r.tpot_ms for r in cold[c][n]) for n in loads} for c in cold
        }
        ratios = ", ".join(
            f"n={n}: {cold_tpot['adaserve'][n] / cold_tpot['none'][n]:.3f}" for n in loads
        )
        print(f"{name}: warm-up rounds (a fresh server, not counted), adaserve / none: {ratios}")
    baseline = {n: statistics.median(r.tpot_ms for r in rs) for n, rs in results["none"].items()}
    print(f"\n{name}: median TPOT ms (SLO attainment) by load; baseline = no speculation")
    print(f"{'config':<10}" + "".join(f"{'n=' + str(n):>18}" for n in loads))
    medians = {}
    for config, by_load in results.items():
        medians[config] = {n: statistics.median(r.tpot_ms for r in rs) for n, rs in by_load.items()}
        cells = []
        for n in loads:
            att = attainment(by_load[n], class_slos_ms(baseline[n]), baseline[n])
            cells.append(f"{medians[config][n]:>9.1f} ({'-' if att is None else f'{att:.2f}'})")
        print(f"{config:<10}" + "".join(f"{c:>18}" for c in cells))
    for config, by_load in results.items():
        for n in loads:
            if missed := misses(by_load[n], class_slos_ms(baseline[n]), baseline[n]):
                print(f"  {config} n={n} missed: {'; '.join(missed)}")
    ratios = {
        n: statistics.median(a / b for a, b in zip(rounds["adaserve"][n], rounds["none"][n]))
        for n in loads
    }
    paired = ", ".join(f"n={n}: {r:.3f}" for n, r in ratios.items())
    print(f"{name}: adaserve / none, median over rounds of each round's ratio: {paired}")
    for n in loads:
        slos = class_slos_ms(baseline[n])
        if out_of_reach := [c for c, ms in slos.items() if ms < baseline[n]]:
            print(f"n={n}: out of reach (SLO below the baseline TPOT): {', '.join(out_of_reach)}")
    return medians


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", default="1,4,8")
    parser.add_argument("--tokens", type=int, default=48, help="new tokens per request")
    parser.add_argument("--repeats", type=int, default=1, help="counted rounds per server set")
    parser.add_argument(
        "--warmup", type=int, default=1, help="rounds run first and not counted (default 1)"
    )
    parser.add_argument(
        "--min-batches",
        type=int,
        default=3,
        help="batches per load and round at least, each configuration (default 3)",
    )
    parser.add_argument(
        "--server-sets",
        type=int,
        default=3,
        help="fresh sets of servers, each running --warmup + --repeats rounds (default 3)",
    )
    parser.add_argument("--pairs", default="bigram,bigram-deep,smollm2")
    args = parser.parse_args()
    loads = [int(n) for n in args.loads.split(",")]
    logs = Path(tempfile.mkdtemp(prefix="cost_aware_"))
    pairs = args.pairs.split(",")
    medians = {
        p: run_pair(
            p,
            loads,
            args.tokens,
            args.repeats,
            args.warmup,
            args.min_batches,
            args.server_sets,
            logs,
        )
        for p in pairs
    }
    print(f"\nserver logs: {logs}")
    for p, m in medians.items():
        ratios = {n: m["adaserve"][n] / m["none"][n] for n in loads}
        print(
            f"{p}: adaserve / no speculation median TPOT by load "
            + ", ".join(f"n={n}: {r:.3f}" for n, r in ratios.items())
        )
    last = "smollm2" if "smollm2" in medians else next(iter(medians))
    worst = max(medians[last]["adaserve"][n] / medians[last]["none"][n] for n in loads)
    print(f"adaserve_tpot_over_nospec_max={worst:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
