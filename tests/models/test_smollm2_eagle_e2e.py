"""The default pair end to end: SmolLM2-135M-Instruct with and without the committed EAGLE draft
(SGLang on CPU, the project's path, depth 4, topk 2, 8 draft tokens) gives the same greedy
tokens, and the draft is actually accepted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from sgl_adaspec.models.smollm2 import prepare_smollm2
from sgl_adaspec.testing.server import Server, eagle_flags

REPO = Path(__file__).resolve().parents[2]
DRAFT = REPO / "models" / "smollm2-135m-eagle"
MAX_NEW = 48
QUESTIONS = (
    "What are three tips for staying healthy?",
    "Write a short poem about the ocean.",
    "Explain what a binary search does, step by step.",
)


def chat_ids(target: Path, question: str) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    out = tok.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, return_dict=True
    )
    return list(out["input_ids"])


def greedy(server: Server, ids: list[int]) -> dict:
    body = {"input_ids": ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": MAX_NEW}}
    response = requests.post(f"{server.url}/generate", json=body, timeout=600)
    response.raise_for_status()
    return response.json()


@pytest.mark.slow
def test_greedy_outputs_equal_with_and_without_the_trained_draft(tmp_path: Path) -> None:
    assert json.loads((DRAFT / "config.json").read_text())["architectures"] == [
        "LlamaForCausalLMEagle"
    ]
    target = prepare_smollm2()
    prompts = [chat_ids(target, q) for q in QUESTIONS]

    with Server(target, log_path=tmp_path / "plain.log", startup_timeout_s=600) as plain:
        expected = [greedy(plain, ids) for ids in prompts]
    flags = eagle_flags(DRAFT, steps=4, topk=2, num_draft_tokens=8)
    with Server(target, flags, log_path=tmp_path / "eagle.log", startup_timeout_s=600) as spec:
        got = [greedy(spec, ids) for ids in prompts]

    for want, have in zip(expected, got):
        assert have["output_ids"] == want["output_ids"]
        assert len(have["output_ids"]) > 8
    completion = sum(r["meta_info"]["completion_tokens"] for r in got)
    verify = sum(r["meta_info"]["spec_verify_ct"] for r in got)
    # A draft that SGLang fed differently from training would be accepted ~never (1.0); the
    # committed early checkpoint gives about 1.2 (see models/smollm2-135m-eagle/README.md).
    assert completion / verify > 1.1
