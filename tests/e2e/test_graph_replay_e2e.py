"""The draft, its extend and the target's verify under SGLang's graph runners, replayed as CUDA
replays them (`ADASPEC_EMULATE_GRAPHS=1`: SGLang's runner classes on CPU,
`adapters/platform/cpu/graph_emulation.py`). A replay runs no plugin Python that hands values
over, so a policy decides on replayed drafts only from what the graph itself writes: these tests fail if
the path probabilities travel any other way."""

from __future__ import annotations

import json

import pytest
import requests

from sgl_adaspec.adapters.platform.cpu.graph_emulation import EMULATE_GRAPHS_ENV
from sgl_adaspec.local_server import client
from sgl_adaspec.local_server.launch import eagle_flags

from .conftest import start
from .mixed_batch import PROMPTS, run_policy

EMULATED = {EMULATE_GRAPHS_ENV: "1"}
FLAGS = ("--cuda-graph-bs-decode", "1", "2", "4", "8")
BATCH = [prompt for prompt, _ in PROMPTS]  # three prompts: bs 3 replays the bs-4 graph padded
MAX_NEW_TOKENS = 24


def _decided_run(tmp_path_factory, models, name: str, env: dict) -> tuple[list, list[dict], dict]:
    """Tetris (its choice rests on the path probabilities alone, not on timing) on the bigram
    pair: the outputs of one batch of three and of one prompt alone, each decided iteration's
    log line, and /server_info's stats."""
    log = tmp_path_factory.mktemp(name) / "decisions.jsonl"
    flags = eagle_flags(models.bigram_eagle_draft, steps=4, topk=2, num_draft_tokens=8)
    server = start(
        tmp_path_factory, name, models.bigram_target, *flags, *FLAGS,
        "--spec-policy", "tetris", "--draft-tiers", "off", "--spec-decision-log", str(log), env=env,
    )  # fmt: skip
    try:
        params = {"temperature": 0.0, "max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True}
        batch = requests.post(
            f"{server.url}/generate", json={"text": BATCH, "sampling_params": params}, timeout=300
        ).json()
        alone = client.generate(server.url, BATCH[0], MAX_NEW_TOKENS, None, 0.0, ignore_eos=True)
        info = requests.get(f"{server.url}/server_info", timeout=60).json()
    finally:
        server.stop()
    outputs = [out["output_ids"] for out in batch] + [alone["output_ids"]]
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    return outputs, lines, info["internal_states"][0]["adaspec"]["stats"]


def _what_was_decided(lines: list[dict]) -> list[tuple]:
    return [
        (line["draft"], line["verified_per_request"], line["committed_per_request"],
         line["verified_f"])
        for line in lines
        if line["verified_f"] is not None
    ]  # fmt: skip


@pytest.mark.slow  # two servers, ~1 min; the hook table's guard is in the default tier
def test_replayed_drafts_are_decided_as_eager_ones(models, tmp_path_factory):
    eager, eager_lines, eager_stats = _decided_run(tmp_path_factory, models, "eager", {})
    replayed, replayed_lines, stats = _decided_run(
        tmp_path_factory, models, "replayed", EMULATED
    )
    assert replayed == eager
    assert eager_stats["draft_graph_replays"] == 0
    # Every draft ran as a replay of its captured graph, and every one was decided.
    assert stats["drafts"] > 0 and stats["draft_graph_replays"] == stats["drafts"], stats
    assert stats["decided_drafts"] >= 0.95 * stats["drafts"], stats
    # Every draft extend and every target verify after a draft ran as a replay of its
    # captured graph too (the verify on the whole tree, its acceptance restricted).
    assert stats["extend_graph_replays"] == stats["drafts"], stats
    assert stats["verify_graph_replays"] == stats["drafts"], stats
    assert eager_stats["extend_graph_replays"] == eager_stats["verify_graph_replays"] == 0
    # The same iterations, node for node: shapes, what each request verified (with the path
    # probability of each verified node) and what it committed.
    assert _what_was_decided(replayed_lines) == _what_was_decided(eager_lines)
    assert len(_what_was_decided(replayed_lines)) >= 2 * MAX_NEW_TOKENS // 5


# In the slow tier (a server start each); all but adaserve without
# tiers, so that every draft is the configured tree's graph replay (chain tiers draft eagerly).
POLICIES = (pytest.param(("adaserve",), marks=pytest.mark.slow),) + tuple(
    pytest.param((*args, "--draft-tiers", "off"), marks=pytest.mark.slow)
    for args in (("adaspec", "--adaspec-min-depth", "3"), ("tetris",), ("faser",), ("dropin",))
)


@pytest.mark.parametrize("policy_args", POLICIES, ids=lambda args: "-".join(args))
def test_every_policy_is_lossless_on_replayed_drafts(
    models, tmp_path_factory, random_pair_reference, policy_args
):
    outputs, state = run_policy(
        tmp_path_factory, models.target, models.eagle_draft, policy_args, *FLAGS, env=EMULATED
    )
    assert outputs == random_pair_reference
    stats = state["stats"]
    assert stats["draft_graph_replays"] > 0 and stats["verify_graph_replays"] > 0, stats
    assert stats["decided_drafts"] >= 0.95 * stats["drafts"], stats
