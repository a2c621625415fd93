"""Every policy under tensor parallelism (`--tp 2` on CPU, real SGLang): rank 0 decides the
draft shape, the verified nodes and the admission for both ranks (`sgl_adaspec/adapters/speculative/
tp_sync.py`), so greedy outputs of the mixed-SLO batch stay token-identical to one rank
without speculation, and statistics and metrics are counted once.

The test hook `ADASPEC_TEST_RANK_CLOCK_RATES` runs rank 1's plugin clock 5x fast: each rank's
policy then sees other latencies and slack. Without the broadcasts that makes the ranks decide
differently, and the server dies in the first mismatched all-reduce (checked by hand with the
broadcasts removed).
"""

from __future__ import annotations

import pytest

from sgl_adaspec.adapters.speculative.tp_sync import CLOCK_RATES_ENV

from .conftest import metric_values
from .mixed_batch import run_policy

TP2 = ("--tp", "2")
# One OpenMP thread per rank, each on its own core.
TP2_ENV = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1"}
SKEWED_CLOCKS = {**TP2_ENV, CLOCK_RATES_ENV: "1,5"}

POLICIES = (
    ("adaserve",),
    ("adaspec", "--adaspec-min-depth", "3"),  # a depth floor: it would stand down here
    ("tetris", "--tetris-extra", "1"),
    ("faser",),
    ("dropin",),
    ("static",),
)
# Every case runs in the slow tier (each ~70 s on 2 cores): adaserve on the bigram pair with the
# statistics checks below, the others in the parametrized test.
OTHER_CASES = [
    pytest.param(pair, policy_args, marks=pytest.mark.slow, id=f"{pair}-{policy_args[0]}")
    for pair in ("random", "bigram")
    for policy_args in POLICIES
    if (pair, policy_args[0]) != ("bigram", "adaserve")
]


@pytest.mark.slow
def test_adaserve_under_tp2_with_skewed_rank_clocks(
    models, tmp_path_factory, bigram_pair_reference
):
    outputs, state = run_policy(
        tmp_path_factory, models.bigram_target, models.bigram_eagle_draft, ("adaserve",),
        *TP2, "--enable-metrics", env=SKEWED_CLOCKS,
    )  # fmt: skip
    assert outputs == bigram_pair_reference
    stats = state["stats"]
    assert stats["iterations"] + stats["plain_iterations"] > 0
    # Counted on rank 0 only: two custom-SLO requests and one chat request were sent.
    assert stats["classes"]["custom"]["finished"] == 2
    assert stats["classes"]["chat"]["finished"] == 1
    metrics = metric_values(state["metrics"])
    for bucket in ("custom_le_5ms", "custom_gt_2000ms"):  # mixed_batch's 5 ms and 5 s SLOs
        assert metrics[f'sglang_adaspec:requests_finished_total{{slo_class="{bucket}"}}'] == 1
    assert metrics['sglang_adaspec:requests_finished_total{slo_class="chat"}'] == 1


@pytest.mark.parametrize(("pair", "policy_args"), OTHER_CASES)
def test_policy_under_tp2_is_lossless(
    models, tmp_path_factory, random_pair_reference, bigram_pair_reference, pair, policy_args
):
    target, draft, reference = (
        (models.target, models.eagle_draft, random_pair_reference)
        if pair == "random"
        else (models.bigram_target, models.bigram_eagle_draft, bigram_pair_reference)
    )
    outputs, state = run_policy(
        tmp_path_factory, target, draft, policy_args, *TP2, env=SKEWED_CLOCKS
    )
    assert outputs == reference
    assert state["spec_policy"] == policy_args[0]
    if policy_args[0] != "static":
        assert state["stats"]["iterations"] + state["stats"]["plain_iterations"] > 0
    if policy_args[0] in ("adaspec", "tetris", "faser"):
        # The chain policies' draft tier (a width-1 beam, not the configured topk 2) ran on
        # both ranks: rank 0's shape was broadcast, or the outputs above would differ or hang.
        assert state["stats"]["draft_width"] == 1, state["stats"]
