"""End to end on CPU with real SGLang servers: the plugin's torch path serves EAGLE and
STANDALONE tree speculation losslessly, and the known-acceptance fixture accepts every draft."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from sgl_adaspec.local_server.launch import Server, eagle_flags, standalone_flags

from .conftest import start

PROMPTS = (
    "def fibonacci(n):",
    "import os\nimport sys\n\n",
    "class Stack:\n    def push(self, item):",
    "x",
)
MAX_NEW_TOKENS = 40


@pytest.fixture(scope="module")
def reference_outputs(plain_server) -> dict[str, list[int]]:
    """Greedy output token ids of every prompt without speculation."""
    return {p: output_ids(plain_server, p) for p in PROMPTS}


def output_ids(server: Server, prompt: str, max_new_tokens: int = MAX_NEW_TOKENS) -> list[int]:
    out = server.generate(prompt, max_new_tokens)
    assert len(out["output_ids"]) == max_new_tokens
    return out["output_ids"]


def test_eagle_tree_greedy_is_token_identical_to_no_speculation(eagle_server, reference_outputs):
    for prompt, expected in reference_outputs.items():
        assert output_ids(eagle_server, prompt) == expected, prompt


def test_eagle_batched_requests_stay_identical(eagle_server, reference_outputs):
    """Several requests decoded in one batch (one /generate call with a list of prompts)."""
    prompts = list(reference_outputs)
    response = requests.post(
        f"{eagle_server.url}/generate",
        json={
            "text": prompts,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": MAX_NEW_TOKENS},
        },
        timeout=300,
    )
    response.raise_for_status()
    for prompt, out in zip(prompts, response.json()):
        assert out["output_ids"] == reference_outputs[prompt], prompt
        assert out["meta_info"]["spec_verify_ct"] > 0


def test_native_and_openai_endpoints_answer(eagle_server):
    url = eagle_server.url
    # No temperature given: SGLang samples at 1.0, i.e. tree verification under sampling.
    # A sampled tiny model may draw its EOS token early, hence ignore_eos on sampled requests.
    native = requests.post(
        f"{url}/generate",
        json={
            "text": "def add(a, b):",
            "sampling_params": {"max_new_tokens": 8, "ignore_eos": True},
        },
        timeout=120,
    )
    assert native.status_code == 200 and native.json()["meta_info"]["completion_tokens"] == 8
    top = requests.post(
        f"{url}/generate",
        json={
            "text": "def add(a, b):",
            "sampling_params": {
                "max_new_tokens": 8,
                "temperature": 0.7,
                "top_k": 5,
                "top_p": 0.9,
                "ignore_eos": True,
            },
        },
        timeout=120,
    )
    assert top.status_code == 200 and top.json()["meta_info"]["completion_tokens"] == 8
    completion = requests.post(
        f"{url}/v1/completions",
        json={"model": "default", "prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0},
        timeout=120,
    )
    assert completion.status_code == 200
    assert completion.json()["usage"]["completion_tokens"] == 8
    chat = requests.post(
        f"{url}/v1/chat/completions",
        json={
            "model": "default",
            "messages": [{"role": "user", "content": "Write a loop."}],
            "max_tokens": 8,
            "temperature": 0,
        },
        timeout=120,
    )
    assert chat.status_code == 200
    assert chat.json()["choices"][0]["message"]["content"] is not None


def test_scheduler_process_receives_the_policy(eagle_server):
    log = Path(eagle_server.log_path).read_text(errors="replace")
    assert "sgl_adaspec: scheduler uses spec policy adaserve" in log


# Two server starts (~45 s on 2 cores): in the slow tier, which CI runs.
@pytest.mark.slow
def test_a_speculative_server_keeps_the_overlap_schedule_unless_told(
    eagle_server, models, tmp_path_factory, reference_outputs
):
    """On CPU SGLang 0.5.23 turns the overlap schedule off for speculative decoding; the plugin
    keeps it, as CUDA runs it, so an iteration runs before the previous one's tokens reach
    the requests (the policy counts what it committed: `RequestState.tokens_decoded`).
    `--disable-overlap-schedule` still serves synchronously, as losslessly."""
    info = requests.get(f"{eagle_server.url}/server_info", timeout=30).json()
    assert info["disable_overlap_schedule"] is False
    log = Path(eagle_server.log_path).read_text(errors="replace")
    assert "Overlap schedule is not implemented for speculative decoding on CPU" not in log
    server = start(
        tmp_path_factory, "eagle-sync", models.target, *eagle_flags(models.eagle_draft),
        "--spec-policy", "adaserve", "--disable-overlap-schedule",
    )  # fmt: skip
    try:
        info = requests.get(f"{server.url}/server_info", timeout=30).json()
        assert info["disable_overlap_schedule"] is True
        for prompt, expected in reference_outputs.items():
            assert output_ids(server, prompt) == expected, prompt
    finally:
        server.stop()


@pytest.mark.slow
def test_standalone_tree_greedy_is_token_identical(models, tmp_path_factory, reference_outputs):
    server = start(
        tmp_path_factory, "standalone", models.target, *standalone_flags(models.standalone_draft)
    )
    try:
        for prompt, expected in reference_outputs.items():
            assert output_ids(server, prompt) == expected, prompt
    finally:
        server.stop()


@pytest.mark.parametrize("kind", ["eagle", pytest.param("standalone", marks=pytest.mark.slow)])
def test_known_acceptance_fixture_accepts_every_draft(models, tmp_path_factory, kind):
    """tiny-bigram's draft predicts the target exactly, so every verify accepts the whole
    top-1 path of the tree: steps draft tokens plus the bonus token."""
    steps, topk, num_draft_tokens = 3, 2, 6
    draft = models.bigram_eagle_draft if kind == "eagle" else models.bigram_target
    flags = (eagle_flags if kind == "eagle" else standalone_flags)(
        draft, steps, topk, num_draft_tokens
    )
    server = start(tmp_path_factory, f"bigram-{kind}", models.bigram_target, *flags)
    try:
        verifies = 5
        # The prefill emits one token; each verify commits steps + 1.
        out = server.generate("def f(x):", 1 + verifies * (steps + 1))
    finally:
        server.stop()
    meta = out["meta_info"]
    assert meta["spec_verify_ct"] == verifies
    assert meta["spec_correct_drafts_histogram"] == [0] * steps + [verifies]
    assert meta["completion_tokens"] == 1 + verifies * (steps + 1)
