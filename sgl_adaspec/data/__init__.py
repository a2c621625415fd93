"""Data the package needs at run time, shipped with it (never read from a build machine's path).

- ``spec_bench_questions.jsonl``: the Spec-Bench questions (Apache-2.0; one JSON object a line
  with ``question_id``, ``category`` and ``turns``). Prompts for the draft's training data, the
  simulator's calibration, and the SGLang benchmark's local dataset (``make bench-serving``).
- ``smollm2-135m-eagle/``: the project's EAGLE draft for SmolLM2-135M-Instruct (model card
  inside), the demo's and the benchmarks' default draft.
"""

from __future__ import annotations

from pathlib import Path

SPEC_BENCH_QUESTIONS = Path(__file__).resolve().parent / "spec_bench_questions.jsonl"
SMOLLM2_EAGLE_DRAFT = Path(__file__).resolve().parent / "smollm2-135m-eagle"
