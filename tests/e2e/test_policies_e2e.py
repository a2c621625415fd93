"""Every speculation policy end to end on CPU with real SGLang: greedy outputs of a batch with
mixed SLOs are token-identical to no speculation, sampling still completes, and the policy's
state is visible in /server_info.

Two pairs: the tiny random pair (the draft is almost always rejected: the rejection paths) and
the bigram pair (the draft is always right: the acceptance paths, where each policy's choice of
what to verify decides how many tokens a request commits per iteration).
"""

from __future__ import annotations

import json

import pytest

from .mixed_batch import run_policy

POLICIES = (
    ("adaspec",),
    ("tetris", "--tetris-extra", "1"),
    ("faser",),
    ("dropin",),
)
# The other dropin rules: in the slow tier (each server start costs ~30 s).
VARIANTS = (("dropin", "--dropin-variant", "fsm"), ("dropin", "--dropin-variant", "cache-fsm"))
# The default run keeps one policy besides adaserve (whose losslessness test_adaserve_e2e.py and
# test_cpu_speculation.py check); every policy and variant runs in the slow tier, which CI runs
# too, and again with accepted drafts below.
WITH_REJECTIONS = tuple(
    args if args[0] == "tetris" else pytest.param(args, marks=pytest.mark.slow)
    for args in POLICIES + VARIANTS
)


@pytest.mark.parametrize("policy_args", WITH_REJECTIONS, ids=lambda args: "-".join(args))
def test_policy_is_lossless_with_rejections(
    models, tmp_path_factory, random_pair_reference, policy_args
):
    outputs, state = run_policy(tmp_path_factory, models.target, models.eagle_draft, policy_args)
    assert outputs == random_pair_reference
    assert state["spec_policy"] == policy_args[0]
    assert state["stats"]["iterations"] > 0
    # Each request verifies its root plus at most the 7 draft nodes SGLang's rerank keeps.
    assert 1.0 <= state["stats"]["verified_tokens_per_request"] <= 8.0
    # The verify forward ran on the selected nodes only (the torch backend's ragged verify).
    assert state["stats"]["ragged_verifies"] >= 1, state["stats"]


# adaspec rightly switches speculation off here (a tiny model's draft step costs about what a
# verify pass costs on CPU, so no depth pays); a depth floor keeps its acceptance paths covered.
WITH_ACCEPTANCE = (("adaspec", "--adaspec-min-depth", "3"),) + POLICIES[1:] + VARIANTS


@pytest.mark.slow
@pytest.mark.parametrize("policy_args", WITH_ACCEPTANCE, ids=lambda args: "-".join(args))
def test_policy_is_lossless_and_commits_accepted_drafts(
    models, tmp_path_factory, bigram_pair_reference, policy_args
):
    outputs, state = run_policy(
        tmp_path_factory, models.bigram_target, models.bigram_eagle_draft, policy_args
    )
    assert outputs == bigram_pair_reference
    # The draft is always right, so every policy commits more than one token per verify.
    assert state["stats"]["accepted_tokens_per_verify"] > 1.2


@pytest.mark.slow
def test_faser_early_exit_is_lossless_and_prunes_rows(
    models, tmp_path_factory, random_pair_reference
):
    # Test after layer 1 of 2 with K = half the vocabulary: on random models about half the
    # tested draft tokens exit (with their suffixes) and the rest run the last layer, so both
    # the pruning and the surviving rows' path are exercised on every iteration.
    policy_args = (
        "faser", "--faser-early-exit", "always", "--faser-exit-layer", "1",
        "--faser-exit-topk", "1024",
    )  # fmt: skip
    outputs, state = run_policy(tmp_path_factory, models.target, models.eagle_draft, policy_args)
    assert outputs == random_pair_reference
    stats = state["stats"]
    assert 0 < stats["exited_tokens"] < stats["exit_tested_tokens"]


def test_adaserve_stands_down_where_speculation_does_not_pay(
    models, tmp_path_factory, random_pair_reference
):
    # The random draft is almost never right: with the cost rule (the default) adaserve finds
    # no tree worth its price and runs plain iterations (SGLang's steps-0 path), probing
    # speculation now and then; outputs stay token-identical across the switches. The later
    # waves of the batch come after it found that speculation pays at no load: their requests
    # are prefilled without the draft (`blind_prefill`), and their outputs stay identical too.
    # Three waves, so that prefills come well after the 64 iterations without planned
    # speculation that a blind prefill waits for: a CI run with other jobs beside it saw none
    # in two waves (2026-11-27; its stats were not kept, the message below keeps them now).
    log = tmp_path_factory.mktemp("decisions") / "adaserve.jsonl"
    waves, state = run_policy(
        tmp_path_factory, models.target, models.eagle_draft, ("adaserve",),
        "--spec-decision-log", str(log), waves=3,
    )  # fmt: skip
    assert waves == [random_pair_reference] * 3
    stats = state["stats"]
    # The decision log holds every decided iteration, with why it ran as it did.
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines) == stats["iterations"] + stats["plain_iterations"]
    plain = [line for line in lines if line["draft"][0] == 0]
    assert len(plain) == stats["plain_iterations"]
    assert {line["reason"] for line in plain} <= {"stand down", "measure plain"}
    stood_down = [line for line in plain if line["reason"] == "stand down"]
    assert stood_down and all(line["plan"]["speculate"] is False for line in stood_down)
    drafted = [line for line in lines if line["draft"][0] > 0]
    assert sum(line["reason"] == "probe" for line in drafted) == stats["speculation_reasons"].get(
        "probe", 0
    )
    assert all(line["verified"] >= line["requests"] for line in lines)
    assert lines[-1]["fits"]["verify"] is not None
    assert stats["blind_prefills"] > 0, {k: stats[k] for k in ("iterations", "plain_iterations")}
    assert stats["plain_iterations"] > stats["iterations"]
    # A request served by plain iterations only still reports its TPOT against its SLO.
    assert stats["classes"]["chat"]["finished"] == 1
    assert stats["last_plan"]["speculate"] is False
    assert stats["last_plan"]["plain_tokens_per_ms"] >= stats["last_plan"]["tokens_per_ms"]
    # Once the draft is known to pay at no load, a stand-down skips the draft extend.
    assert stats["warm_plain_iterations"] < stats["plain_iterations"]


def test_adaserve_commits_drafts_where_the_draft_is_right(
    models, tmp_path_factory, bigram_pair_reference
):
    # The bigram draft is always right: its speculative iterations commit several tokens, and
    # the calibration sees the draft's path probabilities understate that. Its plain
    # iterations keep the draft's state (SGLang's steps-0 runtime state with the draft extend),
    # at least until the gain is known; that extend skips the draft's lm_head, and the draft
    # that follows computes the top-k first (`deferred_topk`). The outputs stay
    # token-identical across the switches.
    # A CI run once saw 4 speculative iterations commit 1.0 token per verify here (it was
    # not reproduced alone): the decision log says why each iteration ran as it did.
    log = tmp_path_factory.mktemp("decisions") / "adaserve-bigram.jsonl"
    outputs, state = run_policy(
        tmp_path_factory, models.bigram_target, models.bigram_eagle_draft, ("adaserve",),
        "--spec-decision-log", str(log),
    )  # fmt: skip
    assert outputs == bigram_pair_reference
    stats = state["stats"]
    why = _decision_summary(log)
    assert stats["iterations"] > 0 and stats["accepted_tokens_per_verify"] > 1.5, why
    assert stats["acceptance_predicted_over_observed"] < 1.0
    assert stats["warm_plain_iterations"] > 0
    assert stats["deferred_topk_drafts"] > 0


def _decision_summary(log) -> list[tuple]:
    """Each speculative iteration of a decision log as (reason, draft shape, requests,
    verified, committed): a failure's message says what ran."""
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    fields = ("reason", "draft", "requests", "verified", "committed")
    return [tuple(str(line[name]) for name in fields) for line in lines if line["draft"][0] > 0]
