"""Bench metrics on small hand-computed cases: TPOT, SLO met, attainment, goodput, percentiles,
accepted tokens per verify, and the record a streamed result becomes."""

from __future__ import annotations

import pytest

from sgl_adaspec.bench.http_stream import StreamResult
from sgl_adaspec.bench.metrics import RequestRecord, percentiles, summarize, summarize_group
from sgl_adaspec.bench.replay import SloSettings, to_record
from sgl_adaspec.bench.workloads import WorkloadRequest
from sgl_adaspec.scheduler.request_slo import RequestSlo


def record(index, slo_class, slo_ms, tokens, decode_ms, error=None, verify_ct=None):
    return RequestRecord(
        index=index, slo_class=slo_class, tpot_slo_ms=slo_ms, arrival_s=0.0,
        output_tokens=tokens, ttft_ms=10.0 * (index + 1), decode_ms=decode_ms,
        e2e_ms=None if error else 100.0, error=error, spec_verify_ct=verify_ct,
    )  # fmt: skip


# A: 11 tokens, 400 ms decode -> TPOT 40 <= 50: met.      B: 11 tokens, 600 ms -> 60 > 50: missed.
# C: no SLO, 5 tokens, 100 ms -> TPOT 25: met.             D: failed after 3 tokens: missed.
CASE = [
    record(0, "chat", 50.0, 11, 400.0, verify_ct=5),
    record(1, "chat", 50.0, 11, 600.0, verify_ct=5),
    record(2, "coding", None, 5, 100.0),
    record(3, "coding", 30.0, 3, 20.0, error="HTTP 500: boom", verify_ct=2),
]
WALL_S = 10.0


def test_mean_tpot_is_decode_time_over_tokens_after_the_first():
    assert CASE[0].mean_tpot_ms == pytest.approx(40.0)
    assert CASE[1].mean_tpot_ms == pytest.approx(60.0)
    assert CASE[2].mean_tpot_ms == pytest.approx(25.0)
    assert CASE[3].mean_tpot_ms is None  # failed


def test_slo_met_rules():
    assert [r.slo_met for r in CASE] == [True, False, True, False]
    at_the_limit = record(0, "chat", 40.0, 11, 400.0)
    assert at_the_limit.slo_met  # <=, not <
    one_token = record(0, "chat", 1.0, 1, 0.0)
    assert one_token.mean_tpot_ms is None and one_token.slo_met  # no TPOT to exceed


def test_overall_attainment_goodput_and_throughput():
    overall = summarize_group(CASE, WALL_S)
    assert (overall.num_requests, overall.num_completed, overall.num_met) == (4, 3, 2)
    assert overall.attainment == pytest.approx(2 / 4)
    assert overall.goodput_tokens_per_s == pytest.approx((11 + 5) / 10)  # A and C
    assert overall.throughput_tokens_per_s == pytest.approx((11 + 11 + 5) / 10)
    assert overall.mean_e2e_ms == pytest.approx(100.0)


def test_per_class_uses_the_whole_runs_wall_time():
    per_class = summarize(CASE, WALL_S).per_class
    assert sorted(per_class) == ["chat", "coding"]
    assert per_class["chat"].attainment == pytest.approx(0.5)
    assert per_class["chat"].goodput_tokens_per_s == pytest.approx(11 / 10)
    assert per_class["coding"].attainment == pytest.approx(0.5)
    assert per_class["coding"].goodput_tokens_per_s == pytest.approx(5 / 10)


def test_tpot_percentiles_interpolate_linearly():
    # Completed TPOTs sorted: 25, 40, 60. p90 sits at rank 0.9 * 2 = 1.8: 40 + 0.8 * 20 = 56.
    tpot = summarize_group(CASE, WALL_S).tpot_ms
    assert tpot["p50"] == pytest.approx(40.0)
    assert tpot["p90"] == pytest.approx(56.0)
    assert tpot["p99"] == pytest.approx(59.6)
    assert percentiles([]) == {"p50": None, "p90": None, "p99": None}


def test_accepted_tokens_per_verify_counts_completed_requests_with_verify_passes():
    # A and B: 22 tokens over 10 verify passes; C reports none; D failed.
    assert summarize_group(CASE, WALL_S).accepted_tokens_per_verify == pytest.approx(2.2)
    assert summarize_group(CASE[2:3], WALL_S).accepted_tokens_per_verify is None


def test_all_failed_and_bad_wall_time():
    failed = [record(0, "chat", 50.0, 0, None, error="timeout")]
    group = summarize_group(failed, 1.0)
    assert group.attainment == 0.0 and group.goodput_tokens_per_s == 0.0
    assert group.tpot_ms["p50"] is None
    with pytest.raises(ValueError, match="wall_s"):
        summarize_group(CASE, 0.0)


def test_stream_result_becomes_a_record():
    request = WorkloadRequest(3, 1.0, "hi", 5, RequestSlo("chat", tpot_slo_ms=50.0))
    # Sent 0.05 s late (run started at t=100, due at 101), first token 0.2 s later, 4 more
    # tokens over 0.1 s.
    result = StreamResult(
        start_s=101.05, end_s=101.36, output_tokens=5, first_token_s=101.25,
        last_token_s=101.35, meta_info={"spec_verify_ct": 3},
    )  # fmt: skip
    rec = to_record(request, result, 50.0, run_start_s=100.0)
    assert rec.ttft_ms == pytest.approx(200.0)
    assert rec.decode_ms == pytest.approx(100.0)
    assert rec.mean_tpot_ms == pytest.approx(25.0)
    assert rec.e2e_ms == pytest.approx(310.0)
    assert rec.send_lag_ms == pytest.approx(50.0)
    assert rec.spec_verify_ct == 3 and rec.slo_met
    assert rec.as_dict()["slo_met"] is True


def test_slo_settings_resolve_scale_and_what_is_sent():
    relative = RequestSlo("coding", baseline_multiple=1.2)
    absolute = RequestSlo("chat", tpot_slo_ms=50.0)
    settings = SloSettings(slo_scale=0.5, baseline_tpot_ms=20.0)
    assert settings.target_ms(relative) == pytest.approx(12.0)
    assert settings.target_ms(absolute) == pytest.approx(25.0)
    assert settings.custom_params(relative) == {"tpot_slo_ms": 12.0}
    assert settings.custom_params(RequestSlo("best_effort")) is None
    by_class = SloSettings(baseline_tpot_ms=20.0, send="slo_class")
    assert by_class.custom_params(relative) == {"slo_class": "coding"}
    assert by_class.custom_params(RequestSlo("custom", tpot_slo_ms=7.0)) == {"tpot_slo_ms": 7.0}
    with pytest.raises(ValueError, match="baseline TPOT"):
        SloSettings().target_ms(relative)
    with pytest.raises(ValueError, match="slo_scale 1"):
        SloSettings(slo_scale=2.0, send="slo_class")


def test_ttft_slos_travel_per_class_with_or_without_a_tpot_slo():
    ttft = (("coding", 500.0), ("best_effort", 9e3))
    settings = SloSettings(baseline_tpot_ms=20.0, ttft_slo_ms=ttft)
    coding = RequestSlo("coding", baseline_multiple=1.2)
    assert settings.custom_params(coding) == {"ttft_slo_ms": 500.0, "tpot_slo_ms": 24.0}
    assert settings.custom_params(RequestSlo("best_effort")) == {"ttft_slo_ms": 9e3}
    assert settings.custom_params(RequestSlo("chat", tpot_slo_ms=50.0)) == {"tpot_slo_ms": 50.0}
    with pytest.raises(ValueError, match="TTFT SLO of class 'chat'"):
        SloSettings(ttft_slo_ms=(("chat", 0.0),))


def test_ttft_slo_flag_parses_class_pairs():
    from sgl_adaspec.bench.cli import parse_ttft_slos

    assert parse_ttft_slos("coding=500, chat=2000") == (("coding", 500.0), ("chat", 2000.0))
    with pytest.raises(Exception, match="CLASS=MS"):
        parse_ttft_slos("coding:500")
