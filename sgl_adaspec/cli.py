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
from typing import Any

from sgl_adaspec.config import AdaspecConfig, ConfigError
from sgl_adaspec.speculative.policies import POLICIES, TREE_ALGORITHMS, get_policy_spec

EXIT_BAD_FLAGS = 2


def add_cli_args(_result: Any, parser: argparse.ArgumentParser) -> None:
    """AFTER hook on `ServerArgs.add_cli_args(parser)`."""
    group = parser.add_argument_group("sgl_adaspec (SLO-aware adaptive speculative decoding)")
    policies = "; ".join(f"{p.name}: {p.summary}" for p in POLICIES.values())
    group.add_argument(
        "--spec-policy",
        type=str,
        default=AdaspecConfig.spec_policy,
        metavar="{" + ",".join(POLICIES) + "}",
        help=f"Speculation policy (default: %(default)s). {policies}. Every policy except "
        f"'static' needs --speculative-algorithm one of {', '.join(TREE_ALGORITHMS)}.",
    )


def config_from_namespace(args: argparse.Namespace) -> AdaspecConfig:
    return AdaspecConfig(spec_policy=getattr(args, "spec_policy", AdaspecConfig.spec_policy))


def check_compatible(config: AdaspecConfig, server_args: Any) -> None:
    """Reject plugin flags that cannot work with SGLang's flags; raises ConfigError."""
    spec = get_policy_spec(config.spec_policy)
    algorithm = getattr(server_args, "speculative_algorithm", None)
    if spec.needs_speculation and (algorithm or "").upper() not in TREE_ALGORITHMS:
        raise ConfigError(
            f"--spec-policy {config.spec_policy} needs --speculative-algorithm one of "
            f"{', '.join(TREE_ALGORITHMS)} (got {algorithm or 'none'})"
        )


def from_cli_args(original, cls, args: argparse.Namespace):
    """AROUND hook on the classmethod `ServerArgs.from_cli_args(args)`."""
    try:
        config = config_from_namespace(args)
        server_args = original(cls, args)
        check_compatible(config, server_args)
    except ConfigError as exc:
        print(f"sgl_adaspec: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(EXIT_BAD_FLAGS)
    config.export()
    return server_args
