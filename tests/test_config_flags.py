"""Flags declared once on config dataclasses: the CLI, the checks and the ADASPEC_CONFIG carrier
are generated from the fields (`sgl_adaspec/flags.py`). In-process, no SGLang server."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from sgl_adaspec.adapters import cli
from sgl_adaspec.config import CONFIG_ENV, AdaspecConfig, ConfigError
from sgl_adaspec.flags import check_flags, flag, flag_fields, option
from sgl_adaspec.speculative.policies import POLICIES, PolicySpec, build_policy
from sgl_adaspec.speculative.policies.dropin import DropinVariant


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="launch_server")
    cli.add_cli_args(None, parser)
    return parser


def parse(*argv: str) -> AdaspecConfig:
    return cli.config_from_namespace(parser().parse_args(list(argv)))


def round_trip(config: AdaspecConfig, monkeypatch) -> AdaspecConfig:
    monkeypatch.setenv(CONFIG_ENV, config.to_json())
    return AdaspecConfig.from_env()


def test_every_flag_field_is_an_option_with_its_help():
    actions = parser()._option_string_actions
    expected = {option("", f.name): f for f in flag_fields(AdaspecConfig)}
    for name, spec in POLICIES.items():
        if spec.config_class() is not None:
            expected.update({option(name, f.name): f for f in flag_fields(spec.config_class())})
    group = {o for o in actions if o not in ("-h", "--help")}
    assert group == set(expected)
    for opt, f in expected.items():
        assert actions[opt].help == f.metadata["sgl_adaspec_flag"].help
    # Today's names, each policy's under its prefix.
    for opt in ("--adaserve-budget", "--adaserve-budget-rule", "--adaserve-max-nodes-per-request",
                "--adaserve-verify-tokens-per-step", "--adaserve-draft-tokens-per-step",
                "--adaspec-min-depth", "--tetris-extra", "--tetris-turn-on-batch-size",
                "--faser-lengths", "--faser-window", "--faser-early-exit", "--faser-exit-layer",
                "--faser-exit-topk", "--faser-overlap", "--dropin-variant", "--dropin-history",
                "--spec-policy", "--slo-config", "--draft-tiers", "--baseline-tpot-ms",
                "--slo-admission", "--admission-max-wait-ms"):  # fmt: skip
        assert opt in group


def test_help_renders_defaults_as_text():
    text = " ".join(parser().format_help().split())
    assert "(default: mle)" in text and "(default: 64)" in text and "None" not in text


def test_parsed_flags_reach_the_policy_config():
    config = parse("--spec-policy", "faser", "--faser-lengths", "4,1,2,2", "--faser-early-exit")
    assert config.policy_config.lengths == (1, 2, 4)
    assert config.policy_config.early_exit == "auto"
    dropin = parse("--spec-policy", "dropin", "--dropin-variant", "cache-fsm")
    assert dropin.policy_config.variant is DropinVariant.CACHE_FSM
    assert parse().policy_config is None and parse().spec_policy == "static"


@pytest.mark.parametrize(
    "argv",
    [
        ("--spec-policy", "adaserve", "--adaserve-budget", "32", "--adaserve-budget-rule", "knee",
         "--adaserve-verify-tokens-per-step", "20", "--adaserve-draft-tokens-per-step", "8",
         "--adaserve-max-nodes-per-request", "3"),
        ("--spec-policy", "adaspec", "--adaspec-min-depth", "2", "--baseline-tpot-ms", "12.5"),
        ("--spec-policy", "tetris", "--tetris-extra", "2", "--tetris-turn-on-batch-size", "4"),
        ("--spec-policy", "faser", "--faser-lengths", "1,3", "--faser-window", "5",
         "--faser-early-exit", "always", "--faser-exit-layer", "3", "--faser-exit-topk", "4"),
        ("--spec-policy", "dropin", "--dropin-variant", "fsm", "--dropin-history", "3",
         "--slo-admission", "on", "--admission-max-wait-ms", "10", "--draft-tiers", "off"),
        (),
    ],
)  # fmt: skip
def test_every_policy_round_trips_through_the_carrier(argv, monkeypatch):
    config = parse(*argv)
    assert round_trip(config, monkeypatch) == config
    defaults = AdaspecConfig(spec_policy=config.spec_policy)
    assert argv == () or config != defaults  # the flags were not lost on the way


def test_carrier_holds_the_chosen_policys_flags_only():
    values = json.loads(AdaspecConfig.of(spec_policy="tetris", tetris_extra=2).to_json())
    assert values["tetris_extra"] == 2 and values["spec_policy"] == "tetris"
    assert not any(key.startswith(("faser_", "adaserve_", "dropin_")) for key in values)


def test_flat_names_build_a_config():
    config = AdaspecConfig.of(spec_policy="faser", faser_lengths="2,9", faser_window=4)
    assert (config.policy_config.lengths, config.policy_config.window) == ((2, 9), 4)
    assert AdaspecConfig.of(spec_policy="dropin", dropin_variant="fsm").policy_config.variant is (
        DropinVariant.FSM
    )
    with pytest.raises(ConfigError, match="unknown sgl_adaspec config keys: tetris_colour"):
        AdaspecConfig.of(spec_policy="tetris", tetris_colour=1)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"spec_policy": "adaserve", "tetris_extra": 3},
         "--tetris-extra is part of --spec-policy tetris (got --spec-policy adaserve)"),
        ({"faser_lengths": "1,2"}, "--faser-lengths is part of --spec-policy faser"),
        ({"spec_policy": "tetris", "tetris_extra": True}, "--tetris-extra must be an integer"),
        ({"spec_policy": "adaserve", "adaserve_budget_rule": "fast"},
         "--adaserve-budget-rule must be cost or knee, got 'fast'"),
        ({"spec_policy": "faser", "faser_lengths": "0,2"}, "--faser-lengths must be ints >= 1"),
        ({"slo_admission": "maybe"}, "--slo-admission must be one of auto, on, off"),
        ({"admission_max_wait_ms": 0}, "--admission-max-wait-ms must be > 0, got 0"),
        ({"baseline_tpot_ms": -1.0}, "--baseline-tpot-ms must be > 0"),
        ({"spec_policy": "adaserve", "adaserve_max_nodes_per_request": -1},
         "--adaserve-max-nodes-per-request must be >= 0, got -1"),
    ],
)  # fmt: skip
def test_bad_values_name_the_option(values, message):
    with pytest.raises(ConfigError) as err:
        AdaspecConfig.from_mapping(values)
    assert message in str(err.value)


def test_another_policys_flag_at_its_default_is_accepted():
    # The command line always holds every option, at its default where not given.
    assert parse("--spec-policy", "adaspec").policy_config.min_depth == 0
    assert AdaspecConfig.of(spec_policy="adaserve", tetris_extra=1).spec_policy == "adaserve"



@pytest.mark.parametrize(
    ("given", "missing"),
    [
        ({"speculative_num_steps": 3},
         "without --speculative-eagle-topk and --speculative-num-draft-tokens"),
        ({"speculative_num_steps": 3, "speculative_eagle_topk": 4},
         "without --speculative-num-draft-tokens"),
        ({"speculative_num_draft_tokens": 8}, "--speculative-num-steps and --speculative-eagle"),
    ],
)  # fmt: skip
def test_some_but_not_all_draft_shape_flags_are_refused(given, missing):
    # SGLang 0.5.23 takes all three or chooses all three; a subset fails later in a traceback.
    config = AdaspecConfig.from_mapping({"spec_policy": "adaserve"})
    server_args = SimpleNamespace(speculative_algorithm="EAGLE", **given)
    with pytest.raises(ConfigError, match=missing):
        cli.check_compatible(config, server_args)
    server_args.speculative_adaptive = True  # SGLang's adaptive steps choose the shape
    cli.check_compatible(config, server_args)
    for name in ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"):
        setattr(server_args, name, None)
    server_args.speculative_adaptive = False
    cli.check_compatible(config, server_args)  # none given: SGLang chooses them
    server_args.speculative_num_steps = 3
    server_args.speculative_eagle_topk = 2
    server_args.speculative_num_draft_tokens = 6
    cli.check_compatible(config, server_args)
    for tokens, ok in ((1, False), (2, True), (11, True), (12, False)):
        server_args.speculative_num_draft_tokens = tokens  # 3 steps of width 2 score 10 nodes
        if ok:
            cli.check_compatible(config, server_args)
        else:
            with pytest.raises(ConfigError, match=f"must be 2 to 11 .*got {tokens}"):
                cli.check_compatible(config, server_args)
    # static leaves SGLang's flags to SGLang
    cli.check_compatible(AdaspecConfig.from_mapping({}), SimpleNamespace(**given))

@pytest.mark.parametrize(
    ("values", "steps", "message"),
    [
        ({"spec_policy": "tetris", "tetris_extra": 2}, 2, "--tetris-extra 2 leaves no verify"),
        ({"spec_policy": "adaspec", "adaspec_min_depth": 3}, 2, "--adaspec-min-depth 3 exceeds"),
        ({"spec_policy": "faser", "faser_lengths": "1,5"}, 4,
         "--faser-lengths 1,5 exceeds --speculative-num-steps (4)"),
    ],
)  # fmt: skip
def test_policy_flags_are_checked_against_the_draft_depth(values, steps, message):
    server_args = SimpleNamespace(
        speculative_algorithm="EAGLE",
        speculative_eagle_topk=2,
        speculative_num_steps=steps,
        speculative_num_draft_tokens=4,
    )
    config = AdaspecConfig.from_mapping(values)
    with pytest.raises(ConfigError) as err:
        cli.check_compatible(config, server_args)
    assert message in str(err.value)
    server_args.speculative_num_steps = steps + 5
    cli.check_compatible(config, server_args)


def test_build_policy_takes_the_flags_and_the_baseline():
    policy = build_policy(AdaspecConfig.of(spec_policy="tetris", tetris_extra=2,
                                           baseline_tpot_ms=9.0))  # fmt: skip
    assert (policy.config.extra, policy.config.baseline_tpot_ms) == (2, 9.0)
    assert build_policy(AdaspecConfig()) is None


def test_policy_modules_do_not_import_the_plugin_config():
    # The import cycle config -> policies -> faser -> config is gone: flags live in flags.py.
    root = Path(__file__).resolve().parents[1] / "sgl_adaspec"
    for path in [root / "flags.py", *(root / "speculative" / "policies").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.module != "sgl_adaspec.config", path
                assert node.module != "sgl_adaspec.adapters.cli", path


# ---- a new policy: one config dataclass is all its flags need ----


@dataclass(frozen=True)
class ToyConfig:
    depth: int = flag(2, "toy: depth (default: %(default)s).", metavar="D", minimum=1)
    mode: str = flag("a", "toy: mode.", choices=("a", "b", "c"))
    ratio: float | None = flag(None, "toy: ratio.", metavar="R")
    not_a_flag: int = 7
    baseline_tpot_ms: float | None = None

    def __post_init__(self) -> None:
        check_flags(self, "toy")

    def check_steps(self, steps: int) -> None:
        if self.depth > steps:
            raise ConfigError(f"--toy-depth {self.depth} exceeds --speculative-num-steps")


@dataclass
class ToyPolicy:
    config: ToyConfig


@pytest.fixture
def toy(monkeypatch):
    spec = PolicySpec("toy", "a toy policy", True, config=ToyConfig, policy=ToyPolicy)
    monkeypatch.setitem(POLICIES, "toy", spec)
    return spec


def test_a_new_config_field_gets_an_option_a_check_and_the_carrier(toy, monkeypatch):
    actions = parser()._option_string_actions
    assert {"--toy-depth", "--toy-mode", "--toy-ratio"} <= set(actions)
    assert "--toy-not-a-flag" not in actions
    assert actions["--toy-depth"].help == "toy: depth (default: %(default)s)."
    assert actions["--toy-mode"].metavar == "{a,b,c}"

    config = parse("--spec-policy", "toy", "--toy-depth", "5", "--toy-mode", "c",
                   "--toy-ratio", "0.5")  # fmt: skip
    assert config.policy_config == ToyConfig(depth=5, mode="c", ratio=0.5)
    assert json.loads(config.to_json())["toy_depth"] == 5
    assert round_trip(config, monkeypatch) == config

    with pytest.raises(ConfigError, match="--toy-depth must be >= 1, got 0"):
        parse("--spec-policy", "toy", "--toy-depth", "0")
    with pytest.raises(ConfigError, match="--toy-mode must be one of a, b, c, got 'd'"):
        parse("--spec-policy", "toy", "--toy-mode", "d")
    with pytest.raises(ValueError, match="toy depth must be >= 1, got 0"):
        ToyConfig(depth=0)
    with pytest.raises(TypeError, match="toy ratio must be a number"):
        ToyConfig(ratio="fast")
    with pytest.raises(ConfigError, match="--toy-depth is part of --spec-policy toy"):
        parse("--spec-policy", "tetris", "--toy-depth", "5")

    server_args = SimpleNamespace(
        speculative_algorithm="EAGLE", speculative_eagle_topk=2, speculative_num_steps=3
    )
    with pytest.raises(ConfigError, match="--toy-depth 5 exceeds"):
        cli.check_compatible(config, server_args)
    built = build_policy(dataclasses.replace(config, baseline_tpot_ms=4.0))
    assert isinstance(built, ToyPolicy) and built.config.baseline_tpot_ms == 4.0


def test_sglangs_config_file_carries_the_plugins_keys(tmp_path):
    """SGLang's own `--config` YAML takes the plugin's flags as keys, the SLO classes of
    configs/ among them."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    classes = Path(__file__).resolve().parents[1] / "configs" / "slo_classes_cpu_tiny.yaml"
    config = tmp_path / "server.yaml"
    config.write_text(
        "model-path: /nonexistent/model\nspeculative-algorithm: EAGLE\n"
        "speculative-draft-model-path: /nonexistent/draft\nspec-policy: adaserve\n"
        f"slo-config: {classes}\nadaserve-budget: 24\n"
    )
    parse = (
        "import json\n"
        "from sglang.srt.plugins import load_plugins\n"
        "from sglang.srt.server_args import prepare_server_args\n"
        "from sgl_adaspec.config import AdaspecConfig\n"
        "load_plugins()\n"
        f"prepare_server_args(['--config', {str(config)!r}])\n"
        "c = AdaspecConfig.from_env()\n"
        "print(json.dumps({'policy': c.spec_policy, 'budget': c.policy_config.budget,\n"
        "    'coding_ms': c.load_slo_config().classes['coding'].tpot_ms}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "ADASPEC_CONFIG"}
    result = subprocess.run(
        [sys.executable, "-c", parse], capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.splitlines()[-1]) == {
        "policy": "adaserve", "budget": 24, "coding_ms": 30,
    }  # fmt: skip
