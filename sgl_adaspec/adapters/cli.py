"""The plugin's command-line flags on `python -m sglang.launch_server` / `sglang serve`.

Two hooks on SGLang's `ServerArgs`:
- after `add_cli_args`: add the plugin's argument group (so `--help` lists it);
- around `from_cli_args`: read the plugin's values off the parsed namespace (SGLang drops them),
  check them against SGLang's own flags, and publish them to child processes.
A bad value or combination ends the launcher with one clear line and exit code 2, before any
model is loaded.
"""

from __future__ import annotations

import argparse
import sys
from types import SimpleNamespace
from typing import Any

from sgl_adaspec.config import AdaspecConfig, ConfigError
from sgl_adaspec.flags import add_flags, dest, flag_fields
from sgl_adaspec.speculative.policies import POLICIES, TREE_ALGORITHMS, get_policy_spec

EXIT_BAD_FLAGS = 2


def add_cli_args(_result: Any, parser: argparse.ArgumentParser) -> None:
    """AFTER hook on `ServerArgs.add_cli_args(parser)`: the common flags (`AdaspecConfig`), then
    each policy's (its config dataclass, `--<policy>-<field>`)."""
    group = parser.add_argument_group("sgl_adaspec (SLO-aware adaptive speculative decoding)")
    add_flags(group, AdaspecConfig)
    for name, config_class in _policy_config_classes():
        add_flags(group, config_class, name)


def flag_names() -> set[str]:
    """Every plugin flag's argparse destination (`spec_policy`, `tetris_extra`)."""
    names = {f.name for f in flag_fields(AdaspecConfig)}
    for name, config_class in _policy_config_classes():
        names.update(dest(name, f.name) for f in flag_fields(config_class))
    return names


def config_from_namespace(args: argparse.Namespace) -> AdaspecConfig:
    """The plugin's flags off SGLang's parsed namespace (absent ones keep their defaults)."""
    values = vars(args)
    return AdaspecConfig.from_mapping({key: values[key] for key in flag_names() if key in values})


def adopt(config: AdaspecConfig, server_args: Any) -> None:
    """Check `config` against SGLang's flags, read its SLO classes, and publish it to the child
    processes SGLang starts next (raises ConfigError)."""
    check_compatible(config, server_args)
    config.load_slo_config()
    config.export()


def check_compatible(config: AdaspecConfig, server_args: Any) -> None:
    """Reject plugin flags that cannot work with SGLang's flags; raises ConfigError."""
    spec = get_policy_spec(config.spec_policy)
    algorithm = getattr(server_args, "speculative_algorithm", None)
    if spec.needs_speculation and (algorithm or "").upper() not in TREE_ALGORITHMS:
        raise ConfigError(
            f"--spec-policy {config.spec_policy} needs --speculative-algorithm one of "
            f"{', '.join(TREE_ALGORITHMS)} (got {algorithm or 'none'})"
        )
    topk = getattr(server_args, "speculative_eagle_topk", None)
    if spec.needs_speculation and topk is not None and topk < 2:
        # SGLang's topk=1 draft path keeps no draft probabilities, which every policy reads.
        raise ConfigError(
            f"--spec-policy {config.spec_policy} reads the draft's candidate probabilities and "
            f"needs --speculative-eagle-topk >= 2 (got {topk}); chain policies use the most "
            f"probable chain of the tree"
        )
    tp_size = getattr(server_args, "tp_size", 1) or 1
    if tp_size > 1 and getattr(config.policy_config, "early_exit", "off") != "off":
        # The exit test reads the lm_head, which tensor parallelism splits across ranks.
        raise ConfigError(
            f"--faser-early-exit needs --tp 1 (got --tp {tp_size}): the early-exit test reads "
            f"the whole lm_head; drop --faser-early-exit to run faser with tensor parallelism"
        )
    mode = getattr(server_args, "disaggregation_mode", "null") or "null"
    if spec.needs_speculation and mode != "null":
        # The policy plans from iterations it times and prefills it sees; a disaggregated
        # decode server gets its requests' KV and draft state from another process, untested.
        raise ConfigError(
            f"--spec-policy {config.spec_policy} is not supported with --disaggregation-mode "
            f"{mode} (prefill-decode disaggregation is untested with the plugin); serve with "
            "--spec-policy static there"
        )
    if config.spec_observe_lag == "1" and getattr(server_args, "disable_overlap_schedule", False):
        # Without the overlap schedule SGLang answers a finished request before the iteration
        # after its last one ends, so its last outcome would be read too late.
        raise ConfigError(
            "--spec-observe-lag 1 needs SGLang's overlap schedule; drop "
            "--disable-overlap-schedule or use --spec-observe-lag 0"
        )
    check_slo_dispatch(config, server_args)
    steps = getattr(server_args, "speculative_num_steps", None)
    check_steps = getattr(config.policy_config, "check_steps", None)
    if steps is not None and check_steps is not None:
        check_steps(steps)  # the policy's own flags against the draft's depth
    if spec.needs_speculation:
        check_draft_shape_flags(server_args)


def check_policy_shape(policy: str, steps: int, topk: int, draft_tokens: int) -> None:
    """`--spec-policy policy` with an EAGLE draft of this shape, as the launcher checks it (for
    tools that start servers: a shape the launcher would refuse fails before any starts)."""
    shape = SimpleNamespace(
        speculative_algorithm="EAGLE", speculative_num_steps=steps,
        speculative_eagle_topk=topk, speculative_num_draft_tokens=draft_tokens,
    )  # fmt: skip
    check_compatible(AdaspecConfig.of(spec_policy=policy), shape)


# The draft's search: SGLang 0.5.23 chooses all three for the draft model, or takes all three.
DRAFT_SHAPE_FLAGS = {
    "speculative_num_steps": "--speculative-num-steps",
    "speculative_eagle_topk": "--speculative-eagle-topk",
    "speculative_num_draft_tokens": "--speculative-num-draft-tokens",
}


def check_draft_shape_flags(server_args: Any) -> None:
    """Refuses some but not all three of the draft's shape flags, and a number of draft tokens
    outside 2 .. 1 + topk + (steps - 1) topk^2. SGLang 0.5.23 takes each and fails later with a
    traceback: the first at start-up, more draft tokens than its beam search scores at its
    warm-up, one draft token (the root alone) on the first request."""
    if getattr(server_args, "speculative_adaptive", False):
        return  # SGLang's adaptive steps choose the shape themselves
    given = {
        option: value
        for name, option in DRAFT_SHAPE_FLAGS.items()
        if (value := getattr(server_args, name, None)) is not None
    }
    if 0 < len(given) < len(DRAFT_SHAPE_FLAGS):
        missing = [option for option in DRAFT_SHAPE_FLAGS.values() if option not in given]
        shown = ", ".join(f"{option} {value}" for option, value in given.items())
        raise ConfigError(
            f"got {shown} without {' and '.join(missing)}: give all three of the draft's "
            f"shape flags (SGLang 0.5.23 takes all three or chooses all three)"
        )
    if len(given) < len(DRAFT_SHAPE_FLAGS):
        return
    steps, topk, tokens = (getattr(server_args, name) for name in DRAFT_SHAPE_FLAGS)
    # The root, and the best of the topk + (steps - 1) * topk^2 nodes the beam search scores.
    most = 1 + topk + (steps - 1) * topk * topk
    if steps >= 1 and topk >= 1 and not 2 <= tokens <= most:
        raise ConfigError(
            f"--speculative-num-draft-tokens must be 2 to {most} with --speculative-num-steps "
            f"{steps} and --speculative-eagle-topk {topk} (the root and the draft's best "
            f"scored nodes), got {tokens}"
        )


def check_slo_dispatch(config: AdaspecConfig, server_args: Any) -> None:
    if config.slo_dispatch != "on":
        return
    dp_size = getattr(server_args, "dp_size", 1) or 1
    if dp_size < 2:
        raise ConfigError(f"--slo-dispatch on needs --dp 2 or more (got --dp {dp_size})")
    if getattr(server_args, "enable_dp_attention", False):
        raise ConfigError(
            "--slo-dispatch on dispatches to separate replicas; it does not run with "
            "--enable-dp-attention"
        )
    nnodes = getattr(server_args, "nnodes", 1) or 1
    if nnodes > 1:
        # The reports would cross nodes (they ride SGLang's load snapshots, zmq across nodes),
        # but SGLang 0.5.23 runs --dp replicas on one node only; it refuses later, in a traceback.
        raise ConfigError(
            f"--slo-dispatch on needs its --dp replicas on one node (got --nnodes {nnodes}): "
            "SGLang 0.5.23 does not run data-parallel replicas across nodes"
        )
    if config.spec_policy == "static":
        raise ConfigError(
            "--slo-dispatch on reads the replicas' SLO state, which --spec-policy static does "
            "not keep; choose another --spec-policy"
        )


def _policy_config_classes():
    for name, spec in POLICIES.items():
        config_class = spec.config_class()
        if config_class is not None:
            yield name, config_class


# Whether this process parsed a command line (the launcher): a bad flag found later, at SGLang's
# resolution, ends it with one line as well; in-process (`engine.Engine`) it is raised.
_LAUNCHER = False


def from_cli_args(original, cls, args: argparse.Namespace):
    """AROUND hook on the classmethod `ServerArgs.from_cli_args(args)`."""
    global _LAUNCHER
    try:
        config = config_from_namespace(args)
        server_args = original(cls, args)
        adopt(config, server_args)
    except ConfigError as exc:
        _exit_bad_flags(exc)
    _LAUNCHER = True
    return server_args


def _exit_bad_flags(exc: ConfigError):
    print(f"sgl_adaspec: error: {exc}", file=sys.stderr, flush=True)
    sys.exit(EXIT_BAD_FLAGS)


def check_resolved_draft(_result, server_args: Any) -> None:
    """AFTER SGLang's `handle_speculative_decoding` (the launch's flags resolved, before any model
    loads). With no shape flag given SGLang chooses the draft's shape for the target, a chain of
    width 1 for most architectures (3 steps, topk 1, 4 draft tokens; Llama's 5, 4, 8): the same
    width that `check_compatible` refuses when given, which a policy would serve with silently
    unable to select (no draft probabilities)."""
    from sglang.srt.arg_groups.model_override_base import resolving_view

    config = AdaspecConfig.from_env()
    resolved = resolving_view(server_args)
    topk = resolved.speculative_eagle_topk
    if not get_policy_spec(config.spec_policy).needs_speculation or topk is None or topk >= 2:
        return
    error = ConfigError(
        f"--spec-policy {config.spec_policy} needs --speculative-eagle-topk >= 2, and SGLang "
        f"chose --speculative-num-steps {resolved.speculative_num_steps} "
        f"--speculative-eagle-topk {topk} --speculative-num-draft-tokens "
        f"{resolved.speculative_num_draft_tokens} for this target; give the three, e.g. "
        f"--speculative-num-steps 3 --speculative-eagle-topk 4 --speculative-num-draft-tokens 8"
    )
    if _LAUNCHER:
        _exit_bad_flags(error)
    raise error
