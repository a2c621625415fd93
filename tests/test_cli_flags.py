"""The plugin is discovered by SGLang, its flags parse, and bad flags stop the launcher early."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from sgl_adaspec.config import CONFIG_ENV, AdaspecConfig, ConfigError
from sgl_adaspec.speculative.policies import POLICIES


def launch(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_entry_point_is_registered_in_sglang_group():
    names = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert names.get("sgl_adaspec") == "sgl_adaspec.adapters.plugin:register"


EAGLE_TREE = ("--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "/nonexistent")


def test_help_lists_spec_policy_with_choices():
    result = launch("--help")
    assert result.returncode == 0, result.stderr
    assert "--spec-policy" in result.stdout
    for name in POLICIES:
        assert name in result.stdout


BAD_FLAGS = [
        (["--spec-policy", "fastest"], "unknown --spec-policy 'fastest'; choose one of: static"),
        (["--spec-policy", "adaserve"], "--spec-policy adaserve needs --speculative-algorithm"),
        (
            ["--spec-policy", "adaserve", "--speculative-algorithm", "NGRAM"],
            "needs --speculative-algorithm one of EAGLE, EAGLE3, STANDALONE (got NGRAM)",
        ),
        (
            [*EAGLE_TREE, "--spec-policy", "adaserve", "--speculative-num-steps", "3"],
            "got --speculative-num-steps 3 without --speculative-eagle-topk and "
            "--speculative-num-draft-tokens",
        ),
        (
            [*EAGLE_TREE, "--spec-policy", "tetris", "--speculative-num-steps", "3",
             "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "100"],
            "--speculative-num-draft-tokens must be 2 to 11",
        ),  # fmt: skip
        (["--spec-policy", "dropin", "--dropin-variant", "lru"], "--dropin-variant must be one of"),
        (["--spec-policy", "faser", "--faser-early-exit", "often"], "--faser-early-exit must be one of"),
        (["--spec-policy", "tetris", "--faser-early-exit"], "--faser-early-exit is part of --spec-policy faser"),
        (["--spec-policy", "faser", "--faser-exit-topk", "0"], "--faser-exit-topk must be an integer >= 1, got 0"),
        (["--spec-policy", "faser", "--faser-exit-layer", "0"], "--faser-exit-layer must be an integer >= 1, got 0"),
        (["--spec-policy", "faser", "--faser-overlap"], "needs GPU SM partitions"),
        (["--spec-policy", "faser", "--faser-lengths", "2,x"], "--faser-lengths must be"),
        (["--spec-policy", "tetris", "--tetris-extra", "-1"], "--tetris-extra must be >= 0"),
        (["--draft-tiers", "maybe"], "--draft-tiers must be on or off, got 'maybe'"),
        (["--slo-dispatch", "maybe"], "--slo-dispatch must be off or on, got 'maybe'"),
        (
            [*EAGLE_TREE, "--spec-policy", "adaserve", "--slo-dispatch", "on"],
            "--slo-dispatch on needs --dp 2 or more (got --dp 1)",
        ),
        (["--dp", "2", "--slo-dispatch", "on"], "which --spec-policy static does not keep"),
        (
            [*EAGLE_TREE, "--spec-policy", "adaserve", "--slo-dispatch", "on", "--dp", "2",
             "--nnodes", "2", "--node-rank", "0", "--dist-init-addr", "127.0.0.1:29871"],
            "--slo-dispatch on needs its --dp replicas on one node (got --nnodes 2)",
        ),  # fmt: skip
        (
            ["--adaserve-draft-tokens-per-step", "0"],
            "--adaserve-draft-tokens-per-step must be >= 1, got 0",
        ),
        (
            [*EAGLE_TREE, "--speculative-num-steps", "2", "--spec-policy", "tetris",
             "--tetris-extra", "2"],
            "--tetris-extra 2 leaves no verify capacity",
        ),  # fmt: skip
        (
            [*EAGLE_TREE, "--speculative-num-steps", "2", "--spec-policy", "adaspec",
             "--adaspec-min-depth", "3"],
            "--adaspec-min-depth 3 exceeds --speculative-num-steps (2)",
        ),  # fmt: skip
        (
            [*EAGLE_TREE, "--speculative-eagle-topk", "1", "--spec-policy", "faser"],
            "needs --speculative-eagle-topk >= 2 (got 1)",
        ),
        (
            [*EAGLE_TREE, "--tp", "2", "--spec-policy", "faser", "--faser-early-exit"],
            "--faser-early-exit needs --tp 1 (got --tp 2)",
        ),
        (
            [*EAGLE_TREE, "--disaggregation-mode", "decode", "--spec-policy", "adaserve"],
            "--spec-policy adaserve is not supported with --disaggregation-mode decode",
        ),
        (
            [*EAGLE_TREE, "--disable-overlap-schedule", "--spec-policy", "adaserve",
             "--spec-observe-lag", "1"],
            "--spec-observe-lag 1 needs SGLang's overlap schedule",
        ),  # fmt: skip
        (["--spec-observe-lag", "2"], "--spec-observe-lag"),
]

# Every bad-flag case through SGLang's own parsing in one interpreter (an SGLang import costs
# ~12 s on 2 cores): plugins loaded as `python -m sglang.launch_server` loads them, then
# `prepare_server_args(argv)` per case, with its exit code and stderr.
PARSE_EACH = """
import contextlib, io, json, sys
from sglang.srt.plugins import load_plugins
from sglang.srt.server_args import prepare_server_args
load_plugins()
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    code = 0
    with contextlib.redirect_stderr(err):
        try:
            prepare_server_args(argv)
        except SystemExit as exc:
            code = exc.code
    results.append([code, err.getvalue()])
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def parsed_bad_flags() -> list[tuple[int, str]]:
    argvs = [["--model-path", "/nonexistent/model", *flags] for flags, _ in BAD_FLAGS]
    result = subprocess.run(
        [sys.executable, "-c", PARSE_EACH, json.dumps(argvs)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.splitlines()[-1])


def one_clear_line(code: int, stderr: str, message: str) -> None:
    assert code == 2
    errors = [line for line in stderr.splitlines() if line.startswith("sgl_adaspec:")]
    assert len(errors) == 1 and message in errors[0], stderr[-2000:]
    assert "Traceback" not in stderr


@pytest.mark.parametrize("case", range(len(BAD_FLAGS)), ids=lambda i: BAD_FLAGS[i][1][:40])
def test_bad_flags_exit_2_with_one_clear_line_before_loading(parsed_bad_flags, case):
    # The model path does not exist: reaching model loading would fail with another error.
    code, stderr = parsed_bad_flags[case]
    one_clear_line(code, stderr, BAD_FLAGS[case][1])


def test_the_launcher_itself_exits_2_on_a_bad_flag():
    flags, message = BAD_FLAGS[-4]  # checked against SGLang's own --speculative-num-steps
    result = launch("--model-path", "/nonexistent/model", *flags)
    one_clear_line(result.returncode, result.stderr, message)


def test_the_width_sglang_chooses_is_checked_as_a_given_one(models):
    # No shape flag: SGLang chooses (3 steps, topk 1, 4 tokens) for a STANDALONE draft, a width
    # the policy cannot select in; refused at SGLang's resolution, before any model loads.
    result = launch(
        "--model-path", str(models.target), "--speculative-algorithm", "STANDALONE",
        "--speculative-draft-model-path", str(models.standalone_draft),
        "--spec-policy", "adaserve", "--device", "cpu",
    )  # fmt: skip
    one_clear_line(
        result.returncode, result.stderr,
        "--spec-policy adaserve needs --speculative-eagle-topk >= 2, and SGLang chose "
        "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4",
    )  # fmt: skip
    assert "Load weight" not in result.stderr


def test_config_carrier_round_trip(monkeypatch):
    monkeypatch.setenv(CONFIG_ENV, "")  # restored (unset) afterwards, whatever `export` sets
    assert AdaspecConfig.from_env() == AdaspecConfig()
    AdaspecConfig(spec_policy="adaserve").export()
    assert AdaspecConfig.from_env().spec_policy == "adaserve"


@pytest.mark.parametrize("raw", ["{not json", '{"spec_policy": "nope"}', '{"colour": "red"}'])
def test_corrupt_carrier_is_an_error_naming_the_problem(monkeypatch, raw):
    monkeypatch.setenv(CONFIG_ENV, raw)
    with pytest.raises(ConfigError):
        AdaspecConfig.from_env()


def test_torchvision_placeholder_serves_sglang_only():
    code = (
        "import transformers.utils as u\n"
        "assert not u.is_torchvision_available()\n"
        "try:\n"
        "    import torchvision\n"
        "except ImportError:\n"
        "    pass\n"
        "else:\n"
        "    raise SystemExit('non-SGLang import got the placeholder')\n"
        "import sglang.srt.multimodal.internvl_utils\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_plugin_lists_its_flags_itself():
    """`sglang serve --help` prints before plugins load; `python -m sgl_adaspec --help` lists
    every flag the launcher accepts from the plugin."""
    import argparse

    from sgl_adaspec.adapters import cli

    shown = subprocess.run(
        [sys.executable, "-m", "sgl_adaspec", "--help"], capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    parser = argparse.ArgumentParser()
    cli.add_cli_args(None, parser)
    flags = {option for action in parser._actions for option in action.option_strings}
    assert {"--spec-policy", "--adaserve-budget", "--tetris-extra"} <= flags
    assert all(flag in shown.stdout for flag in flags)
