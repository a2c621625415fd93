"""The mixed-SLO batch the policy end-to-end tests send, and one policy server's run of it."""

from __future__ import annotations

import concurrent.futures

import requests

from sgl_adaspec.local_server import client
from sgl_adaspec.local_server.launch import eagle_flags

from .conftest import start

PROMPTS = (
    ("def fibonacci(n):", {"tpot_slo_ms": 5.0}),
    ("import os\nimport sys\n\n", {"tpot_slo_ms": 5000.0}),
    ("The quick brown fox", None),
)
MAX_NEW_TOKENS = 32


def generate(url: str, prompt: str, custom_params: dict | None = None, temperature: float = 0.0):
    # Sampled requests ignore EOS: a random tiny model can draw it before MAX_NEW_TOKENS.
    return client.generate(
        url, prompt, MAX_NEW_TOKENS, custom_params, temperature, ignore_eos=temperature > 0
    )


def concurrent_outputs(url: str) -> list[list[int]]:
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        outputs = list(pool.map(lambda job: generate(url, *job), PROMPTS))
    return [out["output_ids"] for out in outputs]


def reference_outputs(server) -> list[list[int]]:
    return [generate(server.url, prompt, None)["output_ids"] for prompt, _ in PROMPTS]


def run_policy(
    tmp_path_factory,
    target,
    draft,
    policy_args,
    *extra: str,
    env: dict | None = None,
    waves: int = 1,
    allow_fallbacks: bool = False,
) -> tuple[list, dict]:
    """The mixed batch's greedy outputs on a policy server (`waves` times, one after the
    other: a list of each wave's outputs when more than one), after which one sampled request
    and one short request of a named class run; returns (outputs, /server_info's adaspec
    state with the text of /metrics under "metrics" when `extra` enables them)."""
    flags = (
        *eagle_flags(draft, steps=4, topk=2, num_draft_tokens=8),
        "--spec-policy", *policy_args, *extra,
    )  # fmt: skip
    name = f"policy-{'-'.join(policy_args)}"
    server = start(tmp_path_factory, name, target, *flags, env=env)
    try:
        outputs = [concurrent_outputs(server.url) for _ in range(waves)]
        outputs = outputs[0] if waves == 1 else outputs
        sampled = generate(server.url, PROMPTS[0][0], None, temperature=0.8)
        assert sampled["meta_info"]["completion_tokens"] == MAX_NEW_TOKENS
        # A short request of a named class, last: one that adaserve serves without speculation.
        client.generate(server.url, "x = 1", 4, {"slo_class": "chat"}, 0.0)
        info = requests.get(f"{server.url}/server_info", timeout=60).json()
        state = info["internal_states"][0]["adaspec"]
        if "--enable-metrics" in extra:
            state["metrics"] = requests.get(f"{server.url}/metrics", timeout=60).text
    finally:
        server.stop()
    # The adapter falls back to SGLang's behaviour when the plugin raises; that must not happen.
    if not allow_fallbacks:
        assert set(state["fallbacks"].values()) == {0}, state["fallbacks"]
    return outputs, state
