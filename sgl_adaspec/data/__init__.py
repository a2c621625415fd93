"""Data the package needs at run time, shipped with it (never read from a build machine's path).

- ``spec_bench_questions.jsonl``: the Spec-Bench questions (Apache-2.0; one JSON object a line
  with ``question_id``, ``category`` and ``turns``). Prompts for the draft's training data, the
  simulator's calibration, and the SGLang benchmark's local dataset (``make bench-serving``).
"""

from __future__ import annotations

from pathlib import Path

SPEC_BENCH_QUESTIONS = Path(__file__).resolve().parent / "spec_bench_questions.jsonl"
