"""The demo: serve with `--spec-policy adaserve`, send requests with different TPOT SLOs, and
print what each got.

    python -m sgl_adaspec.demo [--tiny] [--keep-logs]

It serves SmolLM2-135M-Instruct (prepared from its PyPI wheel) with the project's trained EAGLE
draft (`models/smollm2-135m-eagle/`), or with `--tiny` the tiny random test models. It starts a
real SGLang server on 127.0.0.1 (CPU), first measures the baseline TPOT without
speculation, then sends one request per SLO class of `configs/slo_classes.yaml` concurrently,
each carrying its SLO in `custom_params`, and prints per request: SLO, measured TPOT, whether it
was met, and the speculation statistics SGLang reports (verify passes, accepted length).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from sgl_adaspec.models.smollm2 import prepare_smollm2
from sgl_adaspec.testing.client import stream_generate
from sgl_adaspec.testing.models import ensure_models
from sgl_adaspec.testing.server import Server, eagle_flags

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
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep-logs", action="store_true", help="print the server log folder")
    parser.add_argument("--tiny", action="store_true", help="the tiny random test models")
    args = parser.parse_args()

    if args.tiny:
        models = ensure_models()
        target, draft = models.target, models.eagle_draft
        shape = eagle_flags(draft)
        print(f"model: {target.name} (tiny local Llama, random weights) with EAGLE draft "
              f"{draft.name}; steps 3, topk 2, 6 draft tokens; device cpu")
    else:
        target, draft = prepare_smollm2(), SMOLLM2_DRAFT
        shape = eagle_flags(draft, steps=4, topk=2, num_draft_tokens=8)
        print(f"model: {target.name} with the project's EAGLE draft {draft.name}; steps 4, "
              f"topk 2, 8 draft tokens; device cpu")
    logs = Path(tempfile.mkdtemp(prefix="sgl_adaspec_demo_"))
    print("starting the baseline server (no speculation) to measure the baseline TPOT ...")
    with Server(target, log_path=logs / "baseline.log") as baseline:
        timing = stream_generate(baseline.url, PROMPTS["coding"], MAX_NEW_TOKENS)
    baseline_tpot_ms = timing.tpot_ms
    slos = class_slos_ms(baseline_tpot_ms)
    print(f"baseline TPOT {baseline_tpot_ms:.2f} ms")

    print("starting the server with --spec-policy adaserve ...")
    flags = (*shape, "--spec-policy", "adaserve")
    with Server(target, extra_args=flags, log_path=logs / "adaserve.log") as server:
        with concurrent.futures.ThreadPoolExecutor(len(slos)) as pool:
            outcomes = list(pool.map(lambda item: send(server.url, *item), slos.items()))

    print(f"{'class':<14}{'SLO ms':>9}{'TPOT ms':>9}{'met':>5}{'tokens':>8}"
          f"{'verifies':>10}{'accept len':>12}")
    for o in outcomes:
        print(f"{o.slo_class:<14}{o.tpot_slo_ms:>9.2f}{o.tpot_ms:>9.2f}{'yes' if o.met else 'no':>5}"
              f"{o.completion_tokens:>8}{o.verify_passes:>10}{o.accept_length:>12.2f}")
    if args.keep_logs:
        print(f"server logs: {logs}")
    met = sum(o.met for o in outcomes)
    print(f"slo_attainment={met / len(outcomes):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
