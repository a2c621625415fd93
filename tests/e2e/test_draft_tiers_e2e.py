"""Draft tiers end to end on CPU with real SGLang: adaserve's load-adaptive (d, w) shrinks the
draft's own beam search (fewer draft rows per iteration than the configured search), and greedy
outputs stay token-identical to no speculation.

With B1 = 9 and B2 = 4 the tier follows the number of running requests n: (4, 4) alone,
(3, 2) for two, (2, 1) for three (a one-beam chain), so one run crosses several tiers.
"""

from __future__ import annotations

import concurrent.futures

import pytest
import requests

from sgl_adaspec.local_server import client
from sgl_adaspec.local_server.launch import eagle_flags

from .conftest import start

PROMPTS = ("def fibonacci(n):", "import os\nimport sys\n\n", "The quick brown fox")
SLOS = ({"tpot_slo_ms": 5.0}, {"tpot_slo_ms": 5000.0}, None)
MAX_NEW_TOKENS = 32
STEPS, TOPK = 4, 4
TIER_FLAGS = ("--adaserve-verify-tokens-per-step", "9", "--adaserve-draft-tokens-per-step", "4")


def generate(url: str, prompt: str, custom_params: dict | None = None, temperature: float = 0.0):
    # Sampled requests ignore EOS: a random tiny model can draw it before MAX_NEW_TOKENS.
    return client.generate(
        url, prompt, MAX_NEW_TOKENS, custom_params, temperature, ignore_eos=temperature > 0
    )


def serve(tmp_path_factory, target, draft, *extra) -> tuple[list[list[int]], dict]:
    flags = (
        *eagle_flags(draft, steps=STEPS, topk=TOPK, num_draft_tokens=8),
        "--spec-policy", "adaserve", "--adaserve-budget-rule", "knee", *TIER_FLAGS, *extra,
    )  # fmt: skip
    server = start(tmp_path_factory, "tiers" + "-".join(extra), target, *flags)
    try:
        with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
            outputs = list(pool.map(lambda job: generate(server.url, *job), zip(PROMPTS, SLOS)))
        # One request alone runs the full tier; sampling on a tiered draft completes too.
        alone = generate(server.url, PROMPTS[0], temperature=0.8)
        assert alone["meta_info"]["completion_tokens"] == MAX_NEW_TOKENS
        info = requests.get(f"{server.url}/server_info", timeout=60).json()
    finally:
        server.stop()
    log = server.log_path.read_text()
    assert set(info["internal_states"][0]["adaspec"]["fallbacks"].values()) == {0}
    stats = info["internal_states"][0]["adaspec"]["stats"]
    # The startup log names the tier path and what the tiers took.
    path = "off (--draft-tiers off)" if "off" in extra else "eager, the plugin's torch draft"
    assert f"sgl_adaspec: draft tiers {path}" in log
    return [out["output_ids"] for out in outputs], stats


def reference(server) -> list[list[int]]:
    return [generate(server.url, prompt)["output_ids"] for prompt in PROMPTS]


@pytest.mark.slow  # ~100 s; the default run covers the tiers in test_draft_tiers.py
def test_tiers_shrink_the_draft_and_stay_lossless(models, tmp_path_factory, plain_server):
    expected = reference(plain_server)
    tiered, tiered_stats = serve(tmp_path_factory, models.target, models.eagle_draft)
    full, full_stats = serve(
        tmp_path_factory, models.target, models.eagle_draft, "--draft-tiers", "off"
    )
    assert tiered == expected
    assert full == expected
    # The tiers are SGLang runtime states built at start-up (steps 0 for warm plain iterations
    # in both); the iterations switched between several of them with the load.
    assert [4, 4] in tiered_stats["draft_tiers"] and [2, 1] in tiered_stats["draft_tiers"]
    assert full_stats["draft_tiers"] == [[STEPS, TOPK], [0, TOPK]]
    ran = tiered_stats["draft_iterations_by_shape"]
    assert {"4x4", "2x1"} <= set(ran), ran  # three running, then the lone sampled request
    assert set(full_stats["draft_iterations_by_shape"]) == {"4x4"}
    # Off: every iteration drafts (steps - 1) * n * topk rows; on: the tiers run far fewer.
    per_request_full = full_stats["draft_rows_per_iteration"] * full_stats["iterations"]
    assert per_request_full == pytest.approx(
        (STEPS - 1) * TOPK * full_stats["verified_tokens_per_iteration"] * full_stats["iterations"]
        / full_stats["verified_tokens_per_request"]
    )
    assert tiered_stats["draft_rows_per_iteration"] < 0.7 * full_stats["draft_rows_per_iteration"]
    # The last iteration served the lone sampled request: the full tier.
    assert (tiered_stats["draft_depth"], tiered_stats["draft_width"]) == (STEPS, TOPK)


@pytest.mark.slow
def test_tiers_commit_accepted_drafts(models, tmp_path_factory):
    """The bigram pair (the draft is always right): tiered drafts are still accepted."""
    server = start(tmp_path_factory, "plain-bigram", models.bigram_target)
    try:
        expected = reference(server)
    finally:
        server.stop()
    outputs, stats = serve(tmp_path_factory, models.bigram_target, models.bigram_eagle_draft)
    assert outputs == expected
    assert stats["accepted_tokens_per_verify"] > 1.2
