"""Prompt sets, and prompts cut or joined to a requested number of tokens.

Traces without text (Azure, timestamp CSVs, synthetic arrivals) get their prompts from a prompt
set: Spec-Bench's ``question.jsonl`` (first turn of each question) or, without a file, a few
built-in prompts. Matching a length needs the target model's tokenizer: a prompt is a random one
at least that long, cut to the length; when none is long enough, random prompts are joined until
it is. Decoding a cut and re-encoding it can differ from the length by a token or two.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Protocol

import numpy as np

from sgl_adaspec.bench.traces import TraceError

# Used when no prompt file is given (quick runs, tests): short coding, chat and summarization asks.
BUILTIN_PROMPTS: tuple[str, ...] = (
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Write a Python function that checks whether a string is a palindrome.",
    "What are three good ways to stay focused while working from home?",
    "Explain the difference between a process and a thread in simple words.",
    "Summarize the following text in two sentences. The city council met on Tuesday to "
    "discuss the new bus routes, which will connect the northern suburbs to the harbour and "
    "run every ten minutes during rush hour starting next spring.",
    "import os\nimport sys\n\n\ndef main(argv):\n",
    "Translate to French: The weather is nice today and we are going to the park.",
    "List the steps to make a cup of tea.",
)
JOIN = "\n\n"


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class HfTokenizer:
    """A Hugging Face tokenizer from a model folder, without special tokens."""

    def __init__(self, path: Path | str) -> None:
        from transformers import AutoTokenizer  # slow import, only when lengths are matched

        self.path = str(path)
        # Only counting and cutting here: no warning for texts longer than the model's context.
        self._tok = AutoTokenizer.from_pretrained(self.path, model_max_length=sys.maxsize)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)


def load_spec_bench(path: Path) -> tuple[str, ...]:
    """First turn of every question of a Spec-Bench ``question.jsonl``."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such prompt file")
    prompts = []
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}: line {line_no}"
            try:
                question = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{where}: invalid JSON: {exc.msg}") from exc
            turns = question.get("turns") if isinstance(question, dict) else None
            if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
                raise TraceError(f"{where}: expected an object with a non-empty 'turns' list")
            if not turns[0].strip():
                raise TraceError(f"{where}: the first turn is empty")
            prompts.append(turns[0])
    if not prompts:
        raise TraceError(f"{path}: no questions")
    return tuple(prompts)


class PromptMatcher:
    """Prompts of a requested token length drawn from a prompt set."""

    def __init__(self, prompts: tuple[str, ...], tokenizer: Tokenizer) -> None:
        if not prompts:
            raise ValueError("the prompt set is empty")
        self.prompts = prompts
        self.tokenizer = tokenizer
        self._ids = [tokenizer.encode(p) for p in prompts]
        self._join_ids = tokenizer.encode(JOIN)
        if not any(self._ids):
            raise ValueError("every prompt of the set encodes to zero tokens")

    def prompt_with_tokens(self, num_tokens: int, rng: np.random.Generator) -> str:
        if num_tokens < 1:
            raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
        long_enough = [i for i, ids in enumerate(self._ids) if len(ids) >= num_tokens]
        if long_enough:
            ids = self._ids[long_enough[rng.integers(len(long_enough))]]
        else:
            ids = []
            while len(ids) < num_tokens:
                joint = self._join_ids if ids else []
                ids = ids + joint + self._ids[rng.integers(len(self._ids))]
        return self.tokenizer.decode(ids[:num_tokens])

    def truncate(self, text: str, max_tokens: int) -> str:
        ids = self.tokenizer.encode(text)
        return text if len(ids) <= max_tokens else self.tokenizer.decode(ids[:max_tokens])
