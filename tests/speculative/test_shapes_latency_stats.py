"""Shared pieces of the policies on hand-built cases: shape primitives, the online latency model
and the statistics."""

from __future__ import annotations

import pytest
import torch

from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.latency import LinearLatency, VerifyLatency
from sgl_adaspec.speculative.shapes import (
    beams_of_widths,
    chain_positions,
    chain_prefix_mask,
    fits_shape,
    restrict_to_shape,
    selection_from_mask,
)


def two_trees() -> Candidates:
    """Request 0: root -> 0 (.9) -> 2 (.6) -> 4 (.3); root -> 1 (.5) -> 3 (.4); root -> 5 (.2).
    Request 1: root -> 0 (.5) -> 1 (.25); root -> 2 (.4); nodes 3..5 padding."""
    return Candidates(
        tokens=torch.arange(6).repeat(2, 1),
        parents=torch.tensor([[-1, -1, 0, 1, 2, -1], [-1, 0, -1, -1, -1, -1]]),
        path_prob=torch.tensor([[0.9, 0.5, 0.6, 0.4, 0.3, 0.2], [0.5, 0.25, 0.4, 0, 0, 0]]),
        valid=torch.tensor([[True] * 6, [True, True, True, False, False, False]]),
    )


def test_per_request_depth_limits_each_tree():
    kept = restrict_to_shape(two_trees(), torch.tensor([1, 2]), width=2).valid
    assert kept[0].tolist() == [True, True, False, False, False, False]
    assert kept[1].tolist() == [True, True, True, False, False, False]


def test_depth_zero_keeps_nothing():
    kept = restrict_to_shape(two_trees(), torch.tensor([0, 0]), width=4).valid
    assert not kept.any()


def test_trees_that_fit_a_shape_are_their_own_beam_and_others_are_searched():
    # two_trees: request 0 has 3 nodes at depth 1, 2 at depth 2, 1 at depth 3.
    trees = two_trees()
    assert fits_shape(trees, 3, 3) and fits_shape(trees, 5, 4)
    assert not fits_shape(trees, 2, 3)  # node 4 lies at depth 3
    assert not fits_shape(trees, 3, 2)  # three children of request 0's root
    for depth, width in ((3, 3), (5, 4), (2, 3), (3, 2), (1, 1)):
        searched = beams_of_widths(trees, depth, (width,))[0]
        assert torch.equal(restrict_to_shape(trees, depth, width).valid, searched)
    assert restrict_to_shape(trees, 3, 2).valid[0].tolist() == [True, True, True, True, True, False]


def test_beams_of_several_widths_at_once_are_each_width_s_own_beam():
    # Request 0 at width 1: 0 -> 2 -> 4 (the best chain); at width 2 its level 2 keeps 2 and 3
    # (children of 0 and 1), level 3 keeps 4. Request 1: width 1 drops node 2 (0.4 < 0.5).
    beams = beams_of_widths(two_trees(), 3, (1, 2))
    assert beams[0].tolist() == [
        [True, False, True, False, True, False],
        [True, True, False, False, False, False],
    ]
    assert beams[1].tolist() == [
        [True, True, True, True, True, False],
        [True, True, True, False, False, False],
    ]
    # Random beam-shaped trees: the batched beams equal one width at a time.
    torch.manual_seed(0)
    n, d, w = 5, 4, 3
    parents = torch.full((n, d * w), -1)
    for level in range(1, d):
        parents[:, level * w : (level + 1) * w] = (level - 1) * w + torch.randint(0, w, (n, w))
    step = torch.rand(n, d * w)
    path_prob = step.clone()
    for i in range(w, d * w):
        path_prob[:, i] = path_prob.gather(1, parents[:, i : i + 1]).squeeze(1) * step[:, i]
    valid = torch.ones(n, d * w, dtype=torch.bool)
    cands = Candidates(torch.zeros(n, d * w, dtype=torch.long), parents, path_prob, valid)
    for depth in (2, torch.tensor([0, 1, 2, 3, 4])):
        beams = beams_of_widths(cands, depth, (1, 2, 3))
        for i, width in enumerate((1, 2, 3)):
            assert torch.equal(beams[i], restrict_to_shape(cands, depth, width).valid)
            assert int(beams[i].sum(1).max()) <= width * 4
    # A beam searched again at its own shape is itself (the gain table skips that search),
    # and a narrowed tree keeps the checked tree's depths.
    for width in (1, 2, 3):
        shaped = restrict_to_shape(cands, 3, width)
        assert torch.equal(beams_of_widths(shaped, 3, (width,))[0], shaped.valid)
        checked = Candidates(shaped.tokens, shaped.parents, shaped.path_prob, shaped.valid)
        assert torch.equal(shaped.depth, checked.depth)


def test_chain_positions_give_nodes_and_conditional_probabilities():
    nodes, cond = chain_positions(two_trees())
    assert nodes.tolist() == [[0, 2, 4], [0, 1, -1]]
    assert cond[0].tolist() == pytest.approx([0.9, 0.6 / 0.9, 0.3 / 0.6])
    assert cond[1].tolist() == pytest.approx([0.5, 0.5, 0.0])


def test_chain_prefix_mask_takes_the_first_nodes_of_each_chain():
    cands = two_trees()
    nodes, _ = chain_positions(cands)
    mask = chain_prefix_mask(cands, nodes, torch.tensor([2, 5]))
    assert mask[0].tolist() == [True, False, True, False, False, False]
    assert mask[1].tolist() == [True, True, False, False, False, False]
    selection = selection_from_mask(mask)
    assert selection.counts.tolist() == [2, 2] and selection.total_tokens == 6


def test_linear_latency_recovers_a_linear_cost():
    model = LinearLatency(num_features=2)
    for tokens in (8, 16, 32, 64):
        for context in (0, 1000):
            model.observe((tokens, context), 5.0 + 0.5 * tokens + 0.01 * context)
    assert model.predict((48, 500)) == pytest.approx(5.0 + 24 + 5, rel=0.02)


def test_linear_latency_never_predicts_cheaper_for_more_tokens():
    model = LinearLatency(num_features=1)
    # Noise that would fit a negative slope.
    for tokens, ms in ((8, 10.0), (16, 9.5), (32, 9.0)):
        model.observe((tokens,), ms)
    assert model.coefficients()[0] == 0.0
    assert model.predict((64,)) == pytest.approx(9.5)


def test_linear_latency_refits_the_other_slopes_when_one_would_be_negative():
    # What a bigram-pair server measured besides the verify, per draft (steps, rows), while
    # the host slowed down: 4-step drafts of 56 rows, then one of 32 rows (a chain) measured
    # dearer, and one 1-step draft. Clamping the negative rows slope alone left 6.5 ms per
    # step and a -5 ms intercept: the 1-step draft priced at 1.6 ms.
    wide = [17.9, 17.9, 17.2, 19.3, 20.4, 20.6, 13.6, 17.8, 20.7, 17.4, 20.4, 16.2, 21.4, 12.6]
    wide += [38.7, 16.8, 18.8, 19.9, 24.1, 24.7, 22.8, 30.9]
    model = LinearLatency(num_features=2)
    for ms in wide:
        model.observe((4, 56), ms)
    model.observe((1, 8), 10.6)
    model.observe((4, 32), 28.1)
    steps_slope, rows_slope, intercept = model.coefficients().tolist()
    assert rows_slope == 0.0 and steps_slope > 0 and intercept > 0
    assert model.predict((1, 8)) == pytest.approx(10.6, abs=1.0)
    assert model.predict((4, 56)) == pytest.approx(sum(wide + [28.1]) / 23, abs=1.0)


def test_linear_latency_trims_a_stalled_iteration():
    # A server's first speculative iteration (lazy set-up) took 1200 ms; the others 20 + 2 d.
    model = LinearLatency(num_features=1)
    model.observe((4,), 1200.0)
    for depth, ms in ((4, 28.1), (4, 27.9), (2, 24.0), (4, 28.0), (3, 26.0), (4, 28.0)):
        model.observe((depth,), ms)
    assert model.predict((4,)) == pytest.approx(28.0, abs=0.3)
    # A large batch far above the median is a cost, not a stall: it stays in the fit.
    model = LinearLatency(num_features=1)
    for tokens in (1, 1, 2, 2, 4, 4, 512):
        model.observe((tokens,), 1.0 + 0.5 * tokens)
    assert model.predict((512,)) == pytest.approx(257.0, rel=0.01)


def test_linear_latency_refits_every_sixteenth_of_its_window():
    model = LinearLatency(num_features=1, window=64)
    for i in range(64):
        model.observe((i % 4,), 10.0)
    fitted = model.version
    model.coefficients()
    model.observe((1,), 10.0)
    model.coefficients()  # 1 new of 64: the fit stands
    assert model.version == fitted + 1
    for _ in range(3):
        model.observe((1,), 10.0)
    model.coefficients()  # 4 new: refitted
    assert model.version == fitted + 2


def _flat_then_linear(tokens: int) -> float:
    """A GPU forward: flat while memory-bound (up to 200 tokens), then linear."""
    return 40.0 + 0.2 * max(tokens - 200, 0)


def _fitted_on_small_verifies() -> VerifyLatency:
    model = VerifyLatency(window=256)
    for i in range(200):  # a window of verifies under the knee, fitted
        model.observe((40 + 5 * (i % 30), 5000), _flat_then_linear(40 + 5 * (i % 30)))
    model.coefficients()
    return model


def test_a_pass_larger_than_any_seen_and_priced_wrong_refits_at_once():
    # Verifies of 40-185 tokens price 520 at ~40 ms; it takes 104. Without the surprise the
    # fit would stand for 12 more observations (1/16 of the 200 held).
    model = _fitted_on_small_verifies()
    version = model.version
    assert model.predict((520, 5000)) == pytest.approx(40.0, rel=0.05)
    model.observe((520, 5000), _flat_then_linear(520))
    assert model.surprises == 1
    assert model.predict((520, 5000)) > 60.0  # refitted with the large pass
    assert model.version == version + 1


def test_a_pass_within_the_tokens_seen_or_priced_right_is_no_surprise():
    model = _fitted_on_small_verifies()
    version = model.version
    model.observe((100, 9000), 80.0)  # priced wrong, but no larger than the passes held
    model.observe((190, 5000), _flat_then_linear(190))  # larger, priced right
    model.coefficients()
    assert (model.surprises, model.version) == (0, version)


def test_a_surprise_is_judged_against_the_largest_pass_still_held():
    model = LinearLatency(num_features=1, window=4)
    for tokens in (100, 10, 10, 10):
        model.observe((tokens,), 1.0 + tokens)
    model.coefficients()
    model.observe((50,), 500.0)  # judged while 100 is held: no larger; then 100 leaves
    assert model.surprises == 0
    model.observe((10,), 11.0)
    model.observe((60,), 500.0)  # larger than 50, the largest held
    assert model.surprises == 1


def test_linear_latency_before_any_observation_is_unknown():
    assert LinearLatency(num_features=2).predict((1, 1)) is None
    with pytest.raises(ValueError, match="features"):
        LinearLatency(num_features=2).observe((1,), 3.0)


def test_stats_report_verified_tokens_per_request():
    from sgl_adaspec.speculative.stats import SpecStats

    stats = SpecStats()
    assert stats.as_dict()["verified_tokens_per_request"] is None
    stats.observe_iteration([3, 1], [2, 1], budget=8, depth=2, width=1)
    stats.observe_iteration([4], [4], budget=8, depth=3, width=1)
    assert stats.as_dict()["verified_tokens_per_request"] == pytest.approx(8 / 3)
    assert stats.as_dict()["accepted_tokens_per_verify"] == pytest.approx(7 / 3)


def test_replicas_total_sums_counts_and_recomputes_attainment_and_mean_tpot():
    from sgl_adaspec.speculative.stats import SpecStats, replicas_total

    a, b = SpecStats(), SpecStats()
    a.observe_finished("chat", tpot_ms=40.0, tpot_slo_ms=50.0)
    a.observe_finished("chat", tpot_ms=60.0, tpot_slo_ms=50.0)
    b.observe_finished("chat", tpot_ms=20.0, tpot_slo_ms=50.0)
    b.observe_finished("coding", tpot_ms=10.0, tpot_slo_ms=5.0, infeasible=True)
    a.observe_plain(2)
    b.observe_iteration([3], [2], budget=8, depth=2, width=1)
    total = replicas_total([a.as_dict(), b.as_dict()])
    assert total["replicas"] == 2 and total["iterations"] == 1 and total["plain_iterations"] == 1
    chat, coding = total["classes"]["chat"], total["classes"]["coding"]
    assert (chat["finished"], chat["met"]) == (3, 2)
    assert chat["attainment"] == pytest.approx(2 / 3)
    assert chat["mean_tpot_ms"] == pytest.approx(40.0)  # (40 + 60 + 20) / 3, not (50 + 20) / 2
    assert (coding["finished"], coding["met"], coding["infeasible"]) == (1, 0, 1)


def test_linear_latency_predicts_many_points_like_one_at_a_time():
    model = LinearLatency(num_features=2)
    for tokens, context, ms in ((8, 0, 6.0), (16, 500, 9.0), (64, 100, 20.0), (32, 900, 14.0)):
        model.observe((tokens, context), ms)
    tokens = torch.tensor([[1.0, 8.0], [40.0, 200.0]])
    many = model.predict_tensor(tokens, 300.0)
    one = [[model.predict((float(t), 300.0)) for t in row] for row in tokens.tolist()]
    assert many.flatten().tolist() == pytest.approx([x for row in one for x in row])
    assert LinearLatency(num_features=1).predict_tensor(tokens) is None


def test_verify_latency_bends_where_few_tokens_are_cheap():
    # SmolLM2's verify passes on this CPU: 76 ms at 1 token, 158 at 8, 204 at 16, 338 at 64.
    measured = {1: 76.0, 8: 158.0, 16: 204.0, 32: 245.0, 64: 338.0}
    curved, line = VerifyLatency(), LinearLatency(num_features=2)
    for tokens, ms in measured.items():
        if tokens > 1:
            line.observe((tokens, 300), ms)
        curved.observe((tokens, 300), ms)
    assert line.predict((1, 300)) > 1.5 * measured[1]  # a line through many-token passes
    for tokens, ms in measured.items():
        assert curved.predict((tokens, 300)) == pytest.approx(ms, rel=0.1)
    assert curved.predict_tensor(torch.tensor([1.0, 8.0]), 300).tolist() == pytest.approx(
        [curved.predict((1, 300)), curved.predict((8, 300))]
    )
    assert curved.marginal_ms(2) > curved.marginal_ms(32) > 0


def test_verify_latency_stays_linear_on_a_linear_cost():
    model = VerifyLatency()
    for tokens in (1, 4, 8, 16, 64):
        model.observe((tokens, 100), 10.0 + 0.5 * tokens)
    assert model.predict((32, 100)) == pytest.approx(26.0, rel=0.02)
    assert model.marginal_ms(32) == pytest.approx(0.5, rel=0.1)


def test_verify_latency_finds_the_knee_of_a_flat_then_linear_cost():
    # A GPU forward (roofline): 7 ms while memory-bound, up to 200 tokens, then 0.027 ms per
    # token, at 15000 context tokens. A line through both parts prices 52 tokens ~0.56x.
    def roofline(tokens: int) -> float:
        return 7.0 + 0.027 * max(tokens - 200, 0)

    model = VerifyLatency()
    for tokens in (52, 104, 156, 208, 260, 312, 416, 520):
        model.observe((tokens, 15000), roofline(tokens))
    for tokens in (52, 104, 200, 260, 416):
        assert model.predict((tokens, 15000)) == pytest.approx(roofline(tokens), rel=0.05)
    assert 150 <= model.knee <= 260
    assert model.marginal_ms(100) == pytest.approx(0.0, abs=0.005)
    assert model.marginal_ms(400) == pytest.approx(0.027, rel=0.1)
    predicted = model.predict_tensor(torch.tensor([52.0, 416.0]), 15000).tolist()
    assert predicted == pytest.approx([model.predict((52, 15000)), model.predict((416, 15000))])


def test_verify_latency_fits_a_forward_measured_on_an_h100():
    # benchmarks/gpu_forward_cost.py on a lent H100 (sim/data/h100_forward_cost.json): an
    # 8B-shaped forward at 1-2048 tokens and 8K-262K cached tokens. Its knee is soft (+20 %
    # from 1 to 128 tokens): the log term takes that rise, the knee the compute-bound line.
    from sgl_adaspec.sim.latency import load_measured, table_points

    points = table_points(load_measured()["shapes"]["llama-3.1-8b"]["points"])
    model = VerifyLatency()
    for p in points:
        model.observe((p["tokens"], p["batch"] * p["context"]), p["median_ms"])
    for p in points:
        predicted = model.predict((p["tokens"], p["batch"] * p["context"]))
        assert predicted == pytest.approx(p["median_ms"], rel=0.08), p
    assert 128 <= model.knee <= 512


def test_verify_latency_of_one_token_count_only():
    model = VerifyLatency(with_context=False)
    for ms in (80.0, 82.0, 78.0):
        model.observe((1, 0), ms)
    assert model.predict((1, 0)) == pytest.approx(80.0)
    assert model.knee == 1.0


def test_settled_calibration_ratio_counts_only_predictions_made_after_warm_up():
    from sgl_adaspec.speculative.stats import CALIBRATION_WARMUP_TRIALS, SpecStats

    stats = SpecStats()
    # Warm-up: a calibration without trials predicts 3 tokens where 1 came.
    stats.observe_calibration(raw=3.0, calibrated=3.0, observed=1.0)
    stats.calibration_trials = CALIBRATION_WARMUP_TRIALS - 1
    stats.observe_calibration(raw=3.0, calibrated=3.0, observed=1.0)
    assert stats.as_dict()["settled_calibrated_over_observed"] is None
    stats.calibration_trials = CALIBRATION_WARMUP_TRIALS
    for _ in range(100):
        stats.observe_calibration(raw=3.0, calibrated=1.1, observed=1.0)
    report = stats.as_dict()
    assert report["settled_calibrated_over_observed"] == pytest.approx(1.1)
    assert report["settled_predicted_over_observed"] == pytest.approx(3.0)
    assert report["settled_accepted_draft_tokens"] == pytest.approx(100.0)
    assert report["settled_iterations"] == 100
    # The decayed ratio still remembers the warm-up's two iterations.
    assert report["acceptance_calibrated_over_observed"] > 1.1


def test_numeric_slos_get_their_tpot_bucket_as_prometheus_label(prometheus_sink):
    from prometheus_client import REGISTRY

    from sgl_adaspec.speculative.metrics import TPOT_BUCKETS_MS, prometheus_slo_label

    assert prometheus_slo_label("chat", 50.0) == "chat"  # a named class keeps its name
    assert prometheus_slo_label("custom", None) == "custom"
    for below, edge in zip((0.0, *TPOT_BUCKETS_MS), TPOT_BUCKETS_MS):
        assert prometheus_slo_label("custom", edge) == f"custom_le_{edge}ms"
        assert prometheus_slo_label("custom", (below + edge) / 2) == f"custom_le_{edge}ms"
    assert prometheus_slo_label("custom", 2000.5) == "custom_gt_2000ms"

    from sgl_adaspec.speculative.stats import SpecStats

    stats = SpecStats(sinks=[prometheus_sink])
    stats.observe_finished("custom", tpot_ms=30.0, tpot_slo_ms=40.0)
    stats.observe_finished("custom", tpot_ms=90.0, tpot_slo_ms=45.0)
    stats.observe_finished("custom", tpot_ms=90.0, tpot_slo_ms=400.0)
    stats.observe_finished("chat", tpot_ms=90.0, tpot_slo_ms=50.0)

    def sample(name: str, label: str) -> float | None:
        return REGISTRY.get_sample_value(f"sglang_adaspec:{name}", {"slo_class": label})

    assert sample("requests_finished_total", "custom_le_50ms") == 2
    assert sample("requests_slo_met_total", "custom_le_50ms") == 1
    assert sample("requests_finished_total", "custom_le_500ms") == 1
    assert sample("requests_finished_total", "custom") is None  # no series under the bare name
    chat = (sample("requests_finished_total", "chat"), sample("requests_slo_met_total", "chat"))
    assert chat == (1, 0)
    assert stats.classes["custom"].finished == 3  # /server_info keeps the class
