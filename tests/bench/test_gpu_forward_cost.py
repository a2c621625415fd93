"""benchmarks/gpu_forward_cost.py: its attention is grouped-query attention, and the script runs
its grid end to end on the CPU."""

import json

import torch
import torch.nn.functional as F

from tests.bench import BENCHMARKS, load_benchmark


def load():
    return load_benchmark("gpu_forward_cost")


def test_grouped_attention_matches_kv_heads_repeated_per_query_head():
    bench = load()
    torch.manual_seed(0)
    B, q, H, KV, C, d = 2, 3, 8, 2, 5, 4
    query = torch.randn(B, q, H, d)
    k, v = torch.randn(B, KV, C, d), torch.randn(B, KV, C, d)
    reference = F.scaled_dot_product_attention(
        query.transpose(1, 2), k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
    )  # [B, H, q, d]
    got = bench.grouped_query_attention(query, k, v)
    assert torch.allclose(got, reference.transpose(1, 2).reshape(B, q, H * d), atol=1e-5)


def test_parameter_count_of_the_llama_8b_shape_is_the_published_one():
    assert abs(load().SHAPES["llama-3.1-8b"].num_params / 8.03e9 - 1) < 0.005


def test_cpu_smoke_run_times_every_point(tmp_path, capsys):
    bench = load()
    out = tmp_path / "cost.json"
    assert bench.main(["--device", "cpu", "--quick", "--shapes", "tiny", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    points = report["shapes"]["tiny"]["points"]
    assert [(p["batch"], p["tokens"]) for p in points] == [(1, 1), (2, 8), (1, 16)]
    assert all(p["median_ms"] > 0 and len(p["samples_ms"]) >= 3 for p in points)
    assert capsys.readouterr().out.splitlines()[-1].startswith("tiny_decode_bs1_ms=")


def test_compare_reads_the_h100_measurement_against_a_preset(capsys):
    data = BENCHMARKS.parent / "sgl_adaspec" / "sim" / "data" / "h100_forward_cost.json"
    args = [
        "--compare",
        str(data),
        "--preset",
        "h100-llama8b-measured",
        "--draft-shape",
        "eagle-llama-3.1-8b",
    ]
    assert load().main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    shapes = json.loads(data.read_text())["shapes"]
    num_points = len(shapes["llama-3.1-8b"]["points"]) + len(shapes["eagle-llama-3.1-8b"]["points"])
    assert len(lines) == num_points + 2
    # The measured preset leaves a prompt's quadratic attention out: it underestimates the
    # 8192-token prompt, and only it, by more than 6 %; every point within 10 % above.
    ratio = {line.split(" measured")[0]: float(line.rsplit(" ", 1)[1]) for line in lines[:-2]}
    low = {point: r for point, r in ratio.items() if r < 0.94}
    assert list(low) == [point for point in ratio if "q=8192" in point] and len(low) == 1
    assert all(r <= 1.1 for r in ratio.values())
    assert lines[-1] == f"h100-llama8b-measured_over_measured_min={min(ratio.values()):.3f}"
