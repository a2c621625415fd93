"""Bench settings rejected before any server starts, the policy recipes' flags, and the reason
read from a server log when SGLang switches a feature off."""

from __future__ import annotations

from pathlib import Path

import pytest

from sgl_adaspec.bench.cli import build_parser, config_from_args
from sgl_adaspec.bench.policies import SpecShape, get_policy
from sgl_adaspec.bench.runner import BenchConfig, BenchError, ServerSettings, _log_reason
from sgl_adaspec.bench.workloads import WorkloadSpec

SYNTHETIC = WorkloadSpec(synthetic="poisson", num_requests=4)
MODELS = ServerSettings(model=Path("/m"), draft_model=Path("/d"))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "nothing to replay against"),
        ({"policies": ("fastest",)}, "unknown policy 'fastest'; choose from: none, static"),
        ({"policies": ("none",), "servers": ServerSettings()}, "needs a model"),
        ({"policies": ("adaserve",), "servers": ServerSettings(model=Path("/m"))}, "draft model"),
        ({"policies": ("none",), "external": (("none", "http://x:1"),), "servers": MODELS},
         "labels must be unique"),
        ({"external": (("a", "http://x:1"),), "request_rates_per_s": (0.0,)}, "must be > 0"),
        # A shape the launcher would refuse for a plugin policy (its own check), not for static.
        ({"policies": ("static", "tetris"), "servers": ServerSettings(
            model=Path("/m"), draft_model=Path("/d"), shape=SpecShape(3, 2, 12))},
         "policy tetris: --speculative-num-draft-tokens must be 2 to 11"),
        ({"policies": ("adaserve",), "servers": ServerSettings(
            model=Path("/m"), draft_model=Path("/d"), shape=SpecShape(3, 1, 4))},
         "policy adaserve: .*needs --speculative-eagle-topk >= 2"),
        ({"external": (("a", "http://x:1"),), "slo_scale": 2.0, "slo_field": "slo_class"},
         "slo_scale 1"),
    ],
)  # fmt: skip
def test_bad_settings_fail_before_any_server(tmp_path, kwargs, message):
    with pytest.raises((BenchError, ValueError), match=message):
        BenchConfig(workload=SYNTHETIC, out_dir=tmp_path, **kwargs)


def test_policy_flags():
    draft, shape = Path("/d"), SpecShape(steps=3, topk=4, num_draft_tokens=8)
    assert get_policy("none").flags(draft, shape) == ()
    adaserve = get_policy("adaserve").flags(draft, shape)
    assert adaserve[-2:] == ("--spec-policy", "adaserve") and "--speculative-eagle-topk" in adaserve
    adaptive = " ".join(get_policy("sglang-adaptive").flags(draft, shape))
    assert "--speculative-eagle-topk 1 " in adaptive
    assert "--speculative-num-draft-tokens 4" in adaptive
    assert adaptive.endswith("--speculative-adaptive")


def test_log_reason_finds_the_warning_or_the_last_error(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(
        "[2026-01-01 00:00:00] loading\n"
        "[2026-01-01 00:00:01] speculative_adaptive disabled: speculative_eagle_topk=4 (only "
        "topk=1 is supported). Falling back to static speculative params.\n"
        "[2026-01-01 00:00:02] ValueError: something else\n"
        "[2026-01-01 00:00:03] done\n"
    )
    assert _log_reason(log, "speculative_adaptive disabled:").startswith(
        "speculative_adaptive disabled: speculative_eagle_topk=4"
    )
    assert _log_reason(log) == "[2026-01-01 00:00:02] ValueError: something else"
    assert _log_reason(tmp_path / "missing.log") is None


def test_cli_builds_the_config(tmp_path):
    args = build_parser().parse_args([
        "--synthetic", "gamma", "--num-requests", "5", "--request-rate", "1", "2.5",
        "--class-mix", "chat=1", "--server", "mine=http://127.0.0.1:30000/", "--out", str(tmp_path),
        "--server-args", "--max-running-requests 16",
    ])  # fmt: skip
    config = config_from_args(args)
    assert config.external == (("mine", "http://127.0.0.1:30000"),)
    assert config.request_rates_per_s == (1.0, 2.5)
    assert config.workload.class_mix == (("chat", 1.0),)
    assert config.servers.extra_args == ("--max-running-requests", "16")
    assert config.policies == ()
