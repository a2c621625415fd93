"""The demo: serve with `--spec-policy adaserve`, send requests with different TPOT SLOs, and
print what each got.

    python -m sgl_adaspec.demo [--tiny] [--keep-logs]

It serves SmolLM2-135M-Instruct (prepared from its PyPI wheel) with the project's trained EAGLE
draft (`models/smollm2-135m-eagle/`), or with `--tiny` the tiny random test models. It starts
two real SGLang servers on 127.0.0.1 (CPU) side by side, each sleeping when idle: one without
speculation and one with adaserve. After a warm-up batch on each, it measures the baseline TPOT
without speculation at the demo's load (the same requests, concurrently), then sends one
request per SLO class of `configs/slo_classes.yaml` concurrently to adaserve, each carrying its
SLO in `custom_params`, then measures the baseline again (the host's speed drifts), and prints
per request: SLO, measured TPOT, whether it was met, what adaserve chose (in how many
iterations it speculated and how many tokens each verified, or no speculation) and the
expected gain and cost behind its last plan.
A class whose SLO is below the TPOT this machine gives without speculation (absolute classes
made for large models on GPUs) is out of reach of plain decoding: it is named so, its result
is still shown (marked *), and it is left out of the attainment.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import requests
import yaml

from sgl_adaspec.models.smollm2 import prepare_smollm2
from sgl_adaspec.local_server.client import stream_generate
from sgl_adaspec.models.tiny import ensure_models
from sgl_adaspec.speculative.metrics import verified_per_iteration
from sgl_adaspec.local_server.launch import Server, eagle_flags

REPO = Path(__file__).resolve().parent.parent
SMOLLM2_DRAFT = REPO / "models" / "smollm2-135m-eagle"
SLO_CONFIG = REPO / "configs" / "slo_classes.yaml"
PROMPTS = {
    "coding": "def merge_sorted(a, b):",
    "chat": "How do I read a file line by line?",
    "summarization": "Summarize: the module defines helpers for parsing configuration files.",
}
MAX_NEW_TOKENS = 64


@dataclass(frozen=True)
class Outcome:
    slo_class: str
    tpot_slo_ms: float
    tpot_ms: float
    completion_tokens: int
    verify_passes: int
    accept_length: float
    verified: tuple[int, ...]  # tokens verified in each speculative iteration that served it

    @property
    def met(self) -> bool:
        return self.tpot_ms <= self.tpot_slo_ms


def class_slos_ms(baseline_tpot_ms: float) -> dict[str, float]:
    classes = yaml.safe_load(SLO_CONFIG.read_text())["classes"]
    return {
        name: spec["tpot_ms"] if "tpot_ms" in spec else spec["baseline_multiple"] * baseline_tpot_ms
        for name, spec in classes.items()
    }


def send(url: str, slo_class: str, tpot_slo_ms: float) -> Outcome:
    timing = stream_generate(
        url, PROMPTS[slo_class], MAX_NEW_TOKENS, custom_params={"tpot_slo_ms": tpot_slo_ms}
    )
    meta = timing.meta_info
    return Outcome(
        slo_class=slo_class,
        tpot_slo_ms=tpot_slo_ms,
        tpot_ms=timing.tpot_ms,
        completion_tokens=timing.completion_tokens,
        verify_passes=meta.get("spec_verify_ct", 0),
        accept_length=meta.get("spec_accept_length", 1.0),
        verified=tuple(verified_per_iteration(meta)),
    )


def baseline_tpot_ms(url: str) -> float:
    """TPOT without speculation at the demo's load: every class's prompt at once; the median."""
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        timings = list(
            pool.map(lambda prompt: stream_generate(url, prompt, MAX_NEW_TOKENS), PROMPTS.values())
        )
    return sorted(t.tpot_ms for t in timings)[len(timings) // 2]


def speculation_reasons(stats: dict) -> str:
    """Why adaserve's speculative iterations ran, from its /server_info statistics."""
    counts = stats.get("speculation_reasons") or {}
    return ", ".join(f"{reason} {count}" for reason, count in counts.items()) or "none"


def warm_up(url: str, tokens: int) -> None:
    """One batch of every class's prompt: a fresh server's first batch runs up to 2x slower on
    CPU, and adaserve's cost model learns from it what speculation returns here."""
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        list(pool.map(lambda prompt: stream_generate(url, prompt, tokens), PROMPTS.values()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep-logs", action="store_true", help="print the server log folder")
    parser.add_argument("--tiny", action="store_true", help="the tiny random test models")
    args = parser.parse_args()

    if args.tiny:
        models = ensure_models()
        target, draft = models.target, models.eagle_draft
        shape = eagle_flags(draft)
        print(
            f"model: {target.name} (tiny local Llama, random weights) with EAGLE draft "
            f"{draft.name}; steps 3, topk 2, 6 draft tokens; device cpu"
        )
    else:
        target, draft = prepare_smollm2(), SMOLLM2_DRAFT
        shape = eagle_flags(draft, steps=4, topk=2, num_draft_tokens=8)
        print(
            f"model: {target.name} with the project's EAGLE draft {draft.name}; steps 4, "
            f"topk 2, 8 draft tokens; device cpu"
        )
    logs = Path(tempfile.mkdtemp(prefix="sgl_adaspec_demo_"))
    flags = (*shape, "--spec-policy", "adaserve")
    print("starting a server without speculation (the baseline) and one with --spec-policy "
          "adaserve, side by side ...")  # fmt: skip
    with (
        Server(target, log_path=logs / "baseline.log") as baseline,
        Server(target, extra_args=flags, log_path=logs / "adaserve.log") as server,
    ):
        warm_up(baseline.url, 8)
        warm_up(server.url, MAX_NEW_TOKENS)
        # Measured right before adaserve's batch, and again right after it: the host's speed
        # drifts by up to 20 % within minutes here, and the SLOs are set from the first.
        base_ms = baseline_tpot_ms(baseline.url)
        slos = class_slos_ms(base_ms)
        with concurrent.futures.ThreadPoolExecutor(len(slos)) as pool:
            outcomes = list(pool.map(lambda item: send(server.url, *item), slos.items()))
        base_after_ms = baseline_tpot_ms(baseline.url)
        info = requests.get(f"{server.url}/server_info", timeout=60).json()
    print(
        f"baseline TPOT {base_ms:.2f} ms ({len(PROMPTS)} concurrent requests, no speculation; "
        f"{base_after_ms:.2f} ms right after adaserve's requests)"
    )
    reachable = {name: ms >= base_ms for name, ms in slos.items()}
    for name, ms in slos.items():
        if not reachable[name]:
            print(
                f"class {name}: SLO {ms:.2f} ms is below this machine's TPOT without "
                "speculation: beyond plain decoding here (shown with *, left out of the "
                "attainment)"
            )
    stats = info["internal_states"][0]["adaspec"]["stats"]

    print(
        f"{'class':<14}{'SLO ms':>9}{'TPOT ms':>9}{'met':>5}{'tokens':>8}"
        f"{'verifies':>10}{'accept len':>12}  chose"
    )
    for o in outcomes:
        if o.verified:
            chose = (
                f"speculation in {len(o.verified)} of {o.verify_passes} iterations, "
                f"{sum(o.verified) / len(o.verified):.1f} tokens verified in each"
            )
        else:
            chose = "no speculation"
        met = ("yes" if o.met else "no") + ("" if reachable[o.slo_class] else "*")
        print(
            f"{o.slo_class:<14}{o.tpot_slo_ms:>9.2f}{o.tpot_ms:>9.2f}{met:>5}"
            f"{o.completion_tokens:>8}{o.verify_passes:>10}{o.accept_length:>12.2f}  {chose}"
        )
    plan = stats.get("last_plan")
    print(
        f"iterations: {stats['iterations']} speculative ({speculation_reasons(stats)}), "
        f"{stats['plain_iterations']} without speculation"
    )
    if plan:
        shape = f"depth {plan['depth']} x width {plan['width']}, " if plan["speculate"] else ""
        print(
            f"last plan: {'speculate' if plan['speculate'] else 'no speculation'}; best draft "
            f"{shape}{plan['expected_accepted_per_request']:.2f} tokens per request in a "
            f"{plan['iteration_ms']:.1f} ms iteration ({plan['tokens_per_ms']:.4f} tokens/ms) "
            f"vs {plan['plain_tokens_per_ms']:.4f} tokens/ms without ({plan['plain_ms']:.1f} "
            "ms)"
        )
        curve = ", ".join(f"{f:g}->{g:g}" for f, g in plan["acceptance_curve"])
        print(f"acceptance calibration (draft f -> observed): {curve}")
    if args.keep_logs:
        print(f"server logs: {logs}")
    judged = [o for o in outcomes if reachable[o.slo_class]]
    met = sum(o.met for o in judged)
    print(f"slo_attainment={met / len(judged) if judged else 1.0:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
