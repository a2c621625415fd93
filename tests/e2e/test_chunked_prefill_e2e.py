"""Prompts longer than SGLang's prefill chunk (`--chunked-prefill-size`: prefilled over several
iterations, the draft's extend after each chunk) under adaserve stay token-identical to no
speculation with the same chunking, while it speculates on the requests already decoding."""

from __future__ import annotations

import concurrent.futures

import pytest
import requests

from sgl_adaspec.local_server import client
from sgl_adaspec.local_server.launch import eagle_flags

from .conftest import start

CHUNK = ("--chunked-prefill-size", "64")
# Two prompts of several chunks each, one within a chunk; each with its own SLO.
PROMPTS = (
    (" ".join(f"word{i}" for i in range(150)), {"tpot_slo_ms": 5.0}),
    ("def main():\n" + "    x = x + 1\n" * 40, {"tpot_slo_ms": 5000.0}),
    ("The quick brown fox", None),
)
MAX_NEW_TOKENS = 40


def outputs(url: str) -> list[list[int]]:
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        answers = pool.map(
            lambda job: client.generate(url, job[0], MAX_NEW_TOKENS, job[1]), PROMPTS
        )
        return [answer["output_ids"] for answer in answers]


# A server start and long prompts (~1 min on 2 cores): in the slow tier, which CI runs.
@pytest.mark.slow
def test_chunked_prefills_stay_token_identical_under_adaserve(models, tmp_path_factory):
    plain = start(tmp_path_factory, "plain-bigram-chunked", models.bigram_target, *CHUNK)
    try:
        reference = [
            client.generate(plain.url, prompt, MAX_NEW_TOKENS)["output_ids"]
            for prompt, _ in PROMPTS
        ]
    finally:
        plain.stop()
    server = start(
        tmp_path_factory, "adaserve-chunked", models.bigram_target, *CHUNK,
        *eagle_flags(models.bigram_eagle_draft, steps=4, topk=2, num_draft_tokens=8),
        "--spec-policy", "adaserve",
    )  # fmt: skip
    try:
        rounds = [outputs(server.url) for _ in range(2)]
        stats = requests.get(f"{server.url}/server_info", timeout=60).json()
    finally:
        server.stop()
    for answers in rounds:
        assert answers == reference
    assert stats["internal_states"][0]["adaspec"]["stats"]["iterations"] > 0  # it speculated
