"""The GPU path in one run (`make gpu-check` runs it after the tests marked `gpu`): is it lossless,
does it capture graphs only at start-up, do tiered iterations replay graphs, and what does it
serve at 1 to 64 concurrent requests?

    python benchmarks/gpu_check.py [--device cuda|cpu] [--pair smollm2|tiny] [--loads 1,8,32,64]
                                   [--tokens N] [--attention-backend B] [--dtype D]
                                   [--configs none,static,...]

Configurations, one server at a time on the same target and draft: no speculation, static EAGLE
(steps 4, topk 4, 8 draft tokens), SGLang's `--speculative-adaptive` (its own steps switch;
topk 1, starting at 3 steps, one of its candidate steps), adaserve with the configured search only (`--draft-tiers off`), and adaserve
with its draft tiers (`--gpu-draft-tiers on`). Per configuration:
- lossless: greedy outputs of 8 prompts sent at once, token for token against no speculation's;
- captures after start-up: SGLang's graph-capture log lines after "fired up" (must be 0);
- per load n (n requests at once, classes coding/chat/summarization in turn, each carrying its
  TPOT SLO from `sgl_adaspec/data/slo_classes.yaml` with the baseline = no speculation's median
  TPOT at that load): output tokens/s and per-class SLO attainment;
- adaserve's draft iterations per tier, how many drafts, draft extends and verifies were graph
  replays and how many drafts the policy decided (`/server_info`; fails below 95 % decided).
`--device cpu --pair tiny` runs the same code on the CPU recipe (a smoke test of the script:
no graphs there). Exit status 1 when an output differs or a graph was captured after start-up.
Last line: adaserve_tiers_tokens_per_s_over_static_at_max_load=<ratio>.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from sgl_adaspec.bench.prompts import BUILTIN_PROMPTS
from sgl_adaspec.demo import class_slos_ms
from sgl_adaspec.local_server.client import generate, stream_generate
from sgl_adaspec.local_server.launch import CPU_FLAGS, Server, eagle_flags

CLASSES = ("coding", "chat", "summarization")
READY_LINE = "The server is fired up"


def configs(draft: Path) -> dict[str, tuple[str, ...]]:
    tree = eagle_flags(draft, 4, 4, 8)
    return {
        "none": (),
        "static": (*tree, "--spec-policy", "static"),
        "sglang-adaptive": (*eagle_flags(draft, 3, 1, 4), "--speculative-adaptive"),
        "adaserve-no-tiers": (*tree, "--spec-policy", "adaserve", "--draft-tiers", "off"),
        "adaserve-tiers": (*tree, "--spec-policy", "adaserve", "--gpu-draft-tiers", "on"),
    }


def base_flags(device: str, attention_backend: str, dtype: str) -> tuple[str, ...]:
    if device == "cpu":
        return CPU_FLAGS
    return (
        "--device", "cuda", "--attention-backend", attention_backend, "--dtype", dtype,
        "--mem-fraction-static", "0.5", "--max-running-requests", "64",
    )  # fmt: skip


def pair(name: str) -> tuple[Path, Path]:
    if name == "tiny":
        from sgl_adaspec.models.tiny import ensure_models

        models = ensure_models()
        return models.target, models.eagle_draft
    from sgl_adaspec.models.smollm2 import prepare_smollm2
    from sgl_adaspec.models.train_eagle import DEFAULT_EXPORT

    return prepare_smollm2(), DEFAULT_EXPORT


def prompts(count: int) -> list[str]:
    """`count` distinct prompts: the built-in ones, numbered past the first round."""
    return [
        BUILTIN_PROMPTS[i % len(BUILTIN_PROMPTS)] + ("" if i < len(BUILTIN_PROMPTS) else f" ({i})")
        for i in range(count)
    ]


def greedy_outputs(url: str, tokens: int) -> list[list[int]]:
    texts = prompts(len(BUILTIN_PROMPTS))
    with ThreadPoolExecutor(len(texts)) as pool:
        return list(pool.map(lambda t: generate(url, t, tokens)["output_ids"], texts))


def run_load(url: str, n: int, tokens: int, slos: dict[str, float] | None):
    """(tokens/s of the batch, [(class, TPOT ms)]) of n requests sent at once."""
    jobs = [(CLASSES[i % len(CLASSES)], text) for i, text in enumerate(prompts(n))]

    def one(job):
        cls, text = job
        params = {"tpot_slo_ms": round(slos[cls], 3)} if slos else None
        timing = stream_generate(url, text, tokens, params, ignore_eos=True)
        return cls, timing.tpot_ms, timing.completion_tokens

    start = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(one, jobs))
    wall = time.perf_counter() - start
    return sum(r[2] for r in results) / wall, [(c, t) for c, t, _ in results]


def captures_after_start(log: str) -> int:
    """SGLang's graph-capture log lines after the server reported itself ready."""
    after = log.split(READY_LINE, 1)[1] if READY_LINE in log else ""
    return sum("capture" in line.lower() and "graph" in line.lower() for line in after.splitlines())


def adaspec_stats(url: str) -> dict | None:
    info = requests.get(f"{url}/server_info", timeout=60).json()
    state = info["internal_states"][0].get("adaspec")
    return state["stats"] if state else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--pair", default="smollm2", choices=("smollm2", "tiny"))
    parser.add_argument("--loads", default="1,8,32,64")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per request")
    parser.add_argument("--attention-backend", default="triton")
    parser.add_argument("--dtype", default="float32", help="float32 keeps greedy comparable")
    parser.add_argument("--configs", default=None, help="comma-separated subset (default: all)")
    args = parser.parse_args()
    loads = [int(n) for n in args.loads.split(",")]
    target, draft = pair(args.pair)
    flags = base_flags(args.device, args.attention_backend, args.dtype)
    logs = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    reference, baseline, failures = None, {}, []
    table: dict[str, dict[int, tuple[float, dict]]] = {}
    chosen = configs(draft)
    if args.configs:
        unknown = set(args.configs.split(",")) - set(chosen)
        if unknown:
            parser.error(f"--configs: unknown {sorted(unknown)}; choose from {sorted(chosen)}")
        chosen = {name: chosen[name] for name in args.configs.split(",")}
    for name, extra in chosen.items():
        server = Server(target, extra, base_flags=flags, log_path=logs / f"{name}.log")
        try:
            server.start()
        except Exception as exc:  # one configuration that cannot start must not hide the rest
            print(f"{name}: did not start ({exc}); log {server.log_path}", flush=True)
            failures.append(f"{name} did not start")
            server.stop()
            continue
        try:
            outputs = greedy_outputs(server.url, args.tokens)
            table[name] = {}
            for n in loads:
                slos = class_slos_ms(baseline[n]) if n in baseline else None
                rate, results = run_load(server.url, n, args.tokens, slos)
                if slos is None:  # no speculation runs first: its TPOT is the baseline
                    baseline[n] = statistics.median(t for _, t in results)
                    slos = class_slos_ms(baseline[n])
                per_class = {
                    c: sum(t <= slos[c] for k, t in results if k == c)
                    / max(1, sum(k == c for k, _ in results))
                    for c in CLASSES
                    if any(k == c for k, _ in results)
                }
                table[name][n] = (rate, per_class)
            stats = adaspec_stats(server.url)
        finally:
            server.stop()
        log = server.log_path.read_text()
        if reference is None:
            reference = outputs
        differing = sum(a != b for a, b in zip(outputs, reference))
        captures = captures_after_start(log)
        if differing:
            failures.append(f"{name}: {differing} of {len(outputs)} greedy outputs differ")
        if captures:
            failures.append(f"{name}: {captures} graph captures after start-up")
        line = f"{name}: outputs differing {differing}, graph captures after start-up {captures}"
        if stats is not None:
            line += (
                f", draft iterations by tier {stats['draft_iterations_by_shape']}, "
                f"graph replays {stats['draft_graph_replays']} of {stats['drafts']} drafts "
                f"(extend {stats['extend_graph_replays']}, verify "
                f"{stats['verify_graph_replays']}), decided {stats['decided_drafts']}, "
                f"tiers {stats['draft_tiers']}"
            )
            adaserve = name.startswith("adaserve")
            if adaserve and args.device == "cuda" and not stats["draft_graph_replays"]:
                failures.append(f"{name}: no draft ran as a graph replay")
            if adaserve and stats["decided_drafts"] < 0.95 * stats["drafts"]:
                failures.append(
                    f"{name}: decided {stats['decided_drafts']} of {stats['drafts']} drafts"
                )
        print(line, flush=True)
    print(f"\ntokens/s (SLO attainment coding/chat/summarization) by load; logs {logs}")
    print(f"{'config':<18}" + "".join(f"{'n=' + str(n):>28}" for n in loads))
    for name, by_load in table.items():
        cells = []
        for n in loads:
            rate, per_class = by_load[n]
            att = "/".join(f"{per_class.get(c, float('nan')):.2f}" for c in CLASSES)
            cells.append(f"{rate:>8.1f} ({att})")
        print(f"{name:<18}" + "".join(f"{c:>28}" for c in cells))
    for failure in failures:
        print(f"FAILED: {failure}")
    top = max(loads)
    ratio = (
        table["adaserve-tiers"][top][0] / table["static"][top][0]
        if {"adaserve-tiers", "static"} <= set(table)
        else float("nan")
    )
    print(f"adaserve_tiers_tokens_per_s_over_static_at_max_load={ratio:.3f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
