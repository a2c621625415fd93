"""Trace loaders (each format; bad rows rejected naming file and row), prompt matching, rate
rescaling, class mixes and SLOs of built workloads. Small generated files only; the real sample
traces in shared/data are loaded too when present."""

from __future__ import annotations

import os
import json
from pathlib import Path

import numpy as np
import pytest

from sgl_adaspec.bench.prompts import PromptMatcher, load_spec_bench
from sgl_adaspec.bench.traces import (
    TraceError,
    detect_format,
    load_adaserve_trace,
    load_azure_trace,
    load_timestamp_trace,
    load_trace,
    synthetic_trace,
)
from sgl_adaspec.bench.workloads import (
    WorkloadError,
    WorkloadSpec,
    build_workload,
    parse_class_mix,
    rescale_arrivals,
    slo_from_ratio,
)
from sgl_adaspec.scheduler.slo_config import DEFAULT_SLO_CONFIG, load_slo_config

SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"


@pytest.fixture(scope="module")
def slo_config():
    return load_slo_config(DEFAULT_SLO_CONFIG)


class CharTokenizer:
    """One token per character: lengths are exact, so matching can be checked exactly."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))


def adaserve_entry(t_ms, ratio, prompt="def f():", n_in=3, n_out=8):
    return {"emission_time_ms": t_ms, "prompt": prompt, "input_length": n_in,
            "output_length": n_out, "slo_ratio": ratio}  # fmt: skip


def write_json(tmp_path, entries, name="trace.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(entries))
    return path


def write_text(tmp_path, text, name) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --------------------------------------------------------------------------- AdaServe JSON


def test_adaserve_trace_rows_sorted_from_zero_in_seconds(tmp_path):
    path = write_json(tmp_path, [adaserve_entry(1500.0, -50.0), adaserve_entry(500.0, 1.2)])
    rows = load_adaserve_trace(path)
    assert [r.arrival_s for r in rows] == [0.0, 1.0]
    assert [r.slo_ratio for r in rows] == [1.2, -50.0]
    assert rows[0].prompt == "def f():" and rows[0].output_tokens == 8


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"slo_ratio": None}, "entry 1: missing slo_ratio"),
        ({"slo_ratio": 0}, "entry 1: slo_ratio must be < 0"),
        ({"emission_time_ms": -1}, "entry 1: emission_time_ms must be >= 0"),
        ({"output_length": 0}, "entry 1: output_length must be an integer >= 1"),
        ({"input_length": 2.5}, "entry 1: input_length must be an integer >= 1"),
        ({"prompt": ""}, "entry 1: prompt must be a non-empty string"),
        ({"slo_ratio": "fast"}, "entry 1: slo_ratio must be a finite number"),
    ],
)
def test_adaserve_bad_entry_names_file_and_entry(tmp_path, bad, message):
    entry = adaserve_entry(10.0, 1.2)
    for key, value in bad.items():
        if value is None:
            del entry[key]
        else:
            entry[key] = value
    path = write_json(tmp_path, [adaserve_entry(0.0, -50.0), entry])
    with pytest.raises(TraceError, match=message) as info:
        load_adaserve_trace(path)
    assert str(info.value).startswith(str(path))


def test_adaserve_not_a_list_or_not_json(tmp_path):
    with pytest.raises(TraceError, match="expected a JSON list"):
        load_adaserve_trace(write_json(tmp_path, {"emission_time_ms": 0}))
    with pytest.raises(TraceError, match=r"bad.json: line 1: invalid JSON"):
        load_adaserve_trace(write_text(tmp_path, "[{", "bad.json"))
    with pytest.raises(TraceError, match="no requests"):
        load_adaserve_trace(write_json(tmp_path, []))


# --------------------------------------------------------------------------- Azure CSV

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def test_azure_trace_parses_100ns_timestamps(tmp_path):
    path = write_text(
        tmp_path,
        AZURE_HEADER + "2023-11-16 18:17:03.9799600,4808,10\n"
        "2023-11-16 18:17:04.0319600,3180,8\n"
        "2023-11-16 18:17:05.9799600,110,27",  # no newline at the end, as in the real file
        "azure.csv",
    )
    rows = load_azure_trace(path)
    assert [round(r.arrival_s, 6) for r in rows] == [0.0, 0.052, 2.0]
    assert [(r.input_tokens, r.output_tokens) for r in rows] == [(4808, 10), (3180, 8), (110, 27)]
    assert rows[0].prompt is None and rows[0].slo_ratio is None


@pytest.mark.parametrize(
    "row, message",
    [
        ("2023-11-16 18:17:04.0,12x,8", "line 3: ContextTokens '12x' is not an integer"),
        ("2023-11-16 18:17:04.0,12,0", "line 3: GeneratedTokens must be an integer >= 1"),
        ("yesterday,12,8", "line 3: TIMESTAMP 'yesterday' is not a date-time"),
        ("2023-11-16 18:17:04.0,12", "line 3: expected 3 fields, got 2"),
    ],
)
def test_azure_bad_row_names_file_and_line(tmp_path, row, message):
    path = write_text(tmp_path, AZURE_HEADER + "2023-11-16 18:17:03.0,5,5\n" + row + "\n", "a.csv")
    with pytest.raises(TraceError, match=message) as info:
        load_azure_trace(path)
    assert str(info.value).startswith(str(path))


def test_azure_missing_column(tmp_path):
    path = write_text(tmp_path, "TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.0,5\n", "a.csv")
    with pytest.raises(TraceError, match="line 1: missing column.*GeneratedTokens"):
        load_azure_trace(path)


# --------------------------------------------------------------------------- timestamp CSV


def test_timestamp_trace_starts_at_zero_and_sorts(tmp_path):
    path = write_text(tmp_path, "Timestamp\n72.5\n73.0\n72.75\n", "ts.csv")
    rows = load_timestamp_trace(path)
    assert [r.arrival_s for r in rows] == [0.0, 0.25, 0.5]
    assert rows[0].input_tokens is None and rows[0].output_tokens is None


@pytest.mark.parametrize(
    "body, message",
    [
        ("1.0\nsoon\n", "line 3: Timestamp 'soon' is not a number"),
        ("1.0\n-2\n", "line 3: Timestamp must be >= 0"),
        ("1.0\n2.0,3\n", "line 3: expected 1 field, got 2"),
    ],
)
def test_timestamp_bad_row_names_file_and_line(tmp_path, body, message):
    path = write_text(tmp_path, "Timestamp\n" + body, "ts.csv")
    with pytest.raises(TraceError, match=message) as info:
        load_timestamp_trace(path)
    assert str(info.value).startswith(str(path))


def test_format_detection(tmp_path):
    assert detect_format(write_json(tmp_path, [adaserve_entry(0, 1.2)])) == "adaserve"
    assert detect_format(write_text(tmp_path, AZURE_HEADER, "a.csv")) == "azure"
    assert detect_format(write_text(tmp_path, "Timestamp\n1\n", "t.csv")) == "timestamps"
    with pytest.raises(TraceError, match="cannot tell the trace format"):
        detect_format(write_text(tmp_path, "when,what\n", "x.csv"))
    with pytest.raises(TraceError, match="no such trace file"):
        load_trace(tmp_path / "missing.csv")


@pytest.mark.parametrize(
    "name, fmt",
    [
        ("traces/adaserve_rps3.0_ol256.json", "adaserve"),
        ("traces/azure_llm_2023_code.csv", "azure"),
        ("traces/azure_llm_2023_conv.csv", "azure"),
        ("traces/adaspec_code.csv", "timestamps"),
        ("traces/adaspec_conv.csv", "timestamps"),
        ("traces/adaspec_mooncake.csv", "timestamps"),
    ],
)
def test_real_sample_traces_load(name, fmt):
    path = SHARED_DATA / name
    if not path.is_file():
        # CI lays ../shared beside the clone: there the traces must be found.
        if os.environ.get("CI") == "true":
            pytest.fail(f"{path} not present, though CI provides ../shared")
        pytest.skip(f"{path} not present")
    assert detect_format(path) == fmt
    rows = load_trace(path)
    assert rows[0].arrival_s == 0.0 and len(rows) > 100
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(rows, rows[1:]))


# --------------------------------------------------------------------------- synthetic arrivals


@pytest.mark.parametrize("process, cv", [("poisson", 1.0), ("gamma", 2.0), ("gamma", 0.5)])
def test_synthetic_arrivals_have_unit_rate_and_the_asked_burstiness(process, cv):
    rows = synthetic_trace(20_000, process, np.random.default_rng(0), gamma_cv=cv)
    gaps = np.diff([r.arrival_s for r in rows])
    assert rows[0].arrival_s == 0.0
    assert gaps.mean() == pytest.approx(1.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.08)


# --------------------------------------------------------------------------- prompts


def test_spec_bench_first_turns_and_bad_line(tmp_path):
    good = [{"question_id": 1, "category": "qa", "turns": ["What is 2+2?", "And 3+3?"]},
            {"question_id": 2, "category": "coding", "turns": ["Write a loop."]}]  # fmt: skip
    path = write_text(tmp_path, "\n".join(map(json.dumps, good)) + "\n", "q.jsonl")
    assert load_spec_bench(path) == ("What is 2+2?", "Write a loop.")
    bad = write_text(tmp_path, json.dumps(good[0]) + "\n" + '{"turns": []}\n', "bad.jsonl")
    with pytest.raises(TraceError, match=r"bad.jsonl: line 2: expected an object"):
        load_spec_bench(bad)


def test_prompt_matcher_cuts_or_joins_to_the_length():
    matcher = PromptMatcher(("abcdef", "xyz"), CharTokenizer())
    rng = np.random.default_rng(0)
    assert len(matcher.prompt_with_tokens(4, rng)) == 4
    assert matcher.prompt_with_tokens(6, rng) == "abcdef"  # the only one long enough
    joined = matcher.prompt_with_tokens(20, rng)
    assert len(joined) == 20 and "\n\n" in joined
    assert matcher.truncate("abcdef", 3) == "abc" and matcher.truncate("ab", 3) == "ab"


# --------------------------------------------------------------------------- workloads


def test_rescale_keeps_the_shape_and_sets_the_mean_rate():
    # Native rate: 2 gaps over 3 s. At 2 req/s the span becomes 1 s.
    assert rescale_arrivals([0.0, 1.0, 3.0], 2.0) == pytest.approx([0.0, 1 / 3, 1.0])
    assert rescale_arrivals([5.0], 3.0) == [0.0]
    with pytest.raises(WorkloadError, match="must be > 0"):
        rescale_arrivals([0.0, 1.0], 0.0)


def test_class_mix_parsing_and_unknown_class(slo_config):
    assert parse_class_mix("coding=0.6, chat=0.4") == (("coding", 0.6), ("chat", 0.4))
    with pytest.raises(WorkloadError, match="not NAME=WEIGHT"):
        parse_class_mix("coding")
    with pytest.raises(WorkloadError, match="is not a number"):
        parse_class_mix("coding=lots")
    spec = WorkloadSpec(synthetic="poisson", num_requests=3, class_mix=(("gaming", 1.0),))
    with pytest.raises(WorkloadError, match="'gaming' is not a known SLO class.*coding"):
        build_workload(spec, slo_config)


def test_slo_ratio_maps_to_config_classes(slo_config):
    assert slo_from_ratio(1.2, slo_config).slo_class == "coding"
    assert slo_from_ratio(1.2, slo_config).baseline_multiple == 1.2
    assert slo_from_ratio(-50.0, slo_config).slo_class == "chat"
    assert slo_from_ratio(-150.0, slo_config).tpot_slo_ms == 150
    other = slo_from_ratio(-75.0, slo_config)
    assert (other.slo_class, other.tpot_slo_ms) == ("custom", 75.0)
    assert slo_from_ratio(3.0, slo_config).baseline_multiple == 3.0


def test_synthetic_workload_is_seeded_and_follows_the_mix(slo_config):
    spec = WorkloadSpec(synthetic="poisson", num_requests=400, output_tokens=16, seed=7,
                        class_mix=(("coding", 3.0), ("chat", 1.0)))  # fmt: skip
    a, b = build_workload(spec, slo_config), build_workload(spec, slo_config)
    assert a == b
    classes = [r.slo.slo_class for r in a.requests]
    assert classes.count("coding") / len(classes) == pytest.approx(0.75, abs=0.06)
    assert a.needs_baseline and a.class_names == ("chat", "coding")
    assert all(r.output_tokens == 16 and r.input_tokens is None for r in a.requests)
    rescaled = a.at_rate(4.0)
    assert rescaled.rate_per_s == pytest.approx(4.0)
    assert [r.prompt for r in rescaled.requests] == [r.prompt for r in a.requests]


def test_adaserve_workload_keeps_trace_slos_unless_a_mix_is_given(tmp_path, slo_config):
    path = write_json(tmp_path, [adaserve_entry(0, 1.2), adaserve_entry(100, -50.0, n_out=300),
                                 adaserve_entry(200, -150.0)])  # fmt: skip
    spec = WorkloadSpec(trace_path=path, max_output_tokens=64)
    workload = build_workload(spec, slo_config)
    assert [r.slo.slo_class for r in workload.requests] == ["coding", "chat", "summarization"]
    assert [r.output_tokens for r in workload.requests] == [8, 64, 8]
    assert workload.requests[0].prompt == "def f():"
    mixed = build_workload(WorkloadSpec(trace_path=path, class_mix=(("chat", 1.0),)), slo_config)
    assert {r.slo.slo_class for r in mixed.requests} == {"chat"}
    assert not mixed.needs_baseline


def test_azure_workload_matches_prompt_lengths(tmp_path, slo_config):
    path = write_text(tmp_path, AZURE_HEADER + "2023-11-16 18:17:03.0,30,5\n"
                      "2023-11-16 18:17:04.0,500,7\n", "azure.csv")  # fmt: skip
    spec = WorkloadSpec(trace_path=path, max_input_tokens=200)
    with pytest.raises(WorkloadError, match="needs the model's tokenizer"):
        build_workload(spec, slo_config)
    workload = build_workload(spec, slo_config, CharTokenizer())
    assert [len(r.prompt) for r in workload.requests] == [30, 200]  # the second one is capped
    assert [r.input_tokens for r in workload.requests] == [30, 200]
    assert [r.output_tokens for r in workload.requests] == [5, 7]


def test_spec_needs_exactly_one_source():
    with pytest.raises(WorkloadError, match="exactly one"):
        WorkloadSpec()
    with pytest.raises(WorkloadError, match="number of requests"):
        WorkloadSpec(synthetic="gamma")
    with pytest.raises(WorkloadError, match="output_tokens must be >= 1"):
        WorkloadSpec(synthetic="gamma", num_requests=2, output_tokens=0)
