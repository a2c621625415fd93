"""Requests that SGLang retracts mid-decode (KV cache full: back to the queue, prefilled again
later) under adaserve stay token-identical to no speculation: their per-request state (SLO
clock, verified counts, the draft's blind marks) survives a retraction and a fresh prefill.
SGLang's own test switch retracts every third decode step (`SGLANG_TEST_RETRACT`)."""

from __future__ import annotations

import concurrent.futures

import pytest
import requests

from sgl_adaspec.local_server import client
from sgl_adaspec.local_server.launch import eagle_flags

from .conftest import start
from .mixed_batch import MAX_NEW_TOKENS, PROMPTS


# A server start on a small KV pool (~45 s on 2 cores): in the slow tier, which CI runs.
@pytest.mark.slow
def test_retracted_requests_stay_token_identical_under_adaserve(
    models, tmp_path_factory, bigram_pair_reference
):
    server = start(
        tmp_path_factory, "adaserve-retract", models.bigram_target,
        *eagle_flags(models.bigram_eagle_draft, steps=4, topk=2, num_draft_tokens=8),
        "--spec-policy", "adaserve",
        env={"SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": "3"},
    )  # fmt: skip
    try:
        with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
            answers = list(
                pool.map(lambda job: client.generate(server.url, job[0], MAX_NEW_TOKENS, job[1]),
                         PROMPTS)
            )  # fmt: skip
        state = requests.get(f"{server.url}/server_info", timeout=60).json()
    finally:
        server.stop()
    assert [answer["output_ids"] for answer in answers] == bigram_pair_reference
    assert sum(answer["meta_info"]["num_retractions"] for answer in answers) > 0
    assert state["internal_states"][0]["adaspec"]["stats"]["iterations"] > 0  # it speculated
