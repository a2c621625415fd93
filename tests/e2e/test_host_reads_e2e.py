"""Between the draft and the verify the plugin must not wait on the device: on a GPU every host
read of what the draft wrote is a synchronisation that holds the verify's launch and SGLang's
overlap scheduler. The CPU server marks the draft's tensors device-resident and counts such
reads (`ADASPEC_COUNT_HOST_READS=1`, `speculative/host_reads.py`)."""

from __future__ import annotations

from sgl_adaspec.adapters.speculative.host_read_count import COUNT_HOST_READS_ENV

from .mixed_batch import run_policy


def test_adaserve_reads_nothing_of_the_draft_before_the_verify(
    models, tmp_path_factory, bigram_pair_reference
):
    # The bigram draft is right, so adaserve plans, speculates and decides from the draft.
    outputs, state = run_policy(
        tmp_path_factory, models.bigram_target, models.bigram_eagle_draft, ("adaserve",),
        env={COUNT_HOST_READS_ENV: "1"}, waves=2,
    )  # fmt: skip
    assert outputs == [bigram_pair_reference] * 2
    stats = state["stats"]
    assert stats["decided_drafts"] >= 5, stats
    assert stats["host_reads_before_verify"] == 0, stats["host_read_sites"]


def test_adaserve_planned_before_the_last_outcome_is_read_stays_lossless(
    models, tmp_path_factory, bigram_pair_reference
):
    """`--spec-observe-lag 1` on SGLang's overlap schedule (the CPU keeps it), as a GPU runs:
    each iteration is planned and launched before the one before it is read, and its outcome
    reaches the policy one iteration late, read from copies started as it ended."""
    outputs, state = run_policy(
        tmp_path_factory, models.bigram_target, models.bigram_eagle_draft, ("adaserve",),
        "--spec-observe-lag", "1", env={COUNT_HOST_READS_ENV: "1"}, waves=2,
    )  # fmt: skip
    assert outputs == [bigram_pair_reference] * 2
    stats = state["stats"]
    assert stats["decided_drafts"] >= 5, stats
    assert stats["host_reads_before_verify"] == 0, stats["host_read_sites"]
    # Every request is counted once, and the loose SLOs (5 s) are met in both waves.
    custom = stats["classes"]["custom"]
    assert custom["finished"] == 4 and custom["met"] >= 2, custom
    assert stats["accepted_tokens_per_verify"] > 1.0  # the lagged outcomes taught the policy
