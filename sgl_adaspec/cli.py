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
    group.add_argument(
        "--slo-config",
        type=str,
        default=AdaspecConfig.slo_config,
        metavar="PATH",
        help="YAML file of TPOT SLO classes that requests name with custom_params.slo_class "
        "(default: the repository's configs/slo_classes.yaml).",
    )
    group.add_argument(
        "--adaserve-budget",
        type=int,
        default=AdaspecConfig.adaserve_budget,
        metavar="B",
        help="adaserve: tokens verified per iteration across the batch, one root per request "
        "included (default: no budget, every candidate may be verified).",
    )
    group.add_argument(
        "--adaserve-budget-rule",
        choices=("cost", "knee"),
        default=AdaspecConfig.adaserve_budget_rule,
        help="adaserve: cost (default) sizes speculation by its measured cost and calibrated "
        "acceptance each iteration, down to none where it does not pay (--adaserve-budget then "
        "caps B); knee is the paper's rule: B at the start-up profile's knee, depth from eq. 8.",
    )
    group.add_argument(
        "--adaserve-max-nodes-per-request",
        type=int,
        default=AdaspecConfig.adaserve_max_nodes_per_request,
        metavar="N",
        help="adaserve: n_max, the most draft nodes the SLO-customized phase gives one request "
        "(default: all of its candidates).",
    )
    group.add_argument(
        "--adaserve-verify-tokens-per-step",
        type=int,
        default=AdaspecConfig.adaserve_verify_tokens_per_step,
        metavar="B1",
        help="adaserve: B1 of the load-adaptive depth d = clip(B1 / n - 1, 1, num-steps) for n "
        "running requests (default: the verify budget, --adaserve-budget or the start-up "
        "profile's knee; 256 without either).",
    )
    group.add_argument(
        "--adaserve-draft-tokens-per-step",
        type=int,
        default=AdaspecConfig.adaserve_draft_tokens_per_step,
        metavar="B2",
        help="adaserve: B2 of the load-adaptive beam width w = clip(B2 / n, 1, topk) for n "
        "running requests (default: %(default)s).",
    )
    group.add_argument(
        "--draft-tiers",
        type=str,
        default=AdaspecConfig.draft_tiers,
        metavar="{on,off}",
        help="on: the draft's beam search runs at the policy's depth and width (fewer, narrower "
        "draft steps under load); needs --attention-backend torch_native, elsewhere the "
        "configured search runs. off: always the configured search (default: %(default)s).",
    )
    group.add_argument(
        "--baseline-tpot-ms",
        type=float,
        default=AdaspecConfig.baseline_tpot_ms,
        metavar="MS",
        help="TPOT without speculation, for SLO classes stated as a multiple of it (default: "
        "estimated online from the target's verify-pass latency).",
    )
    group.add_argument(
        "--slo-admission",
        type=str,
        default=AdaspecConfig.slo_admission,
        metavar="{auto,on,off}",
        help="Admit waiting requests by urgency (least slack against custom_params.ttft_slo_ms, "
        "with aging) instead of SGLang's order. auto: on for adaserve, off otherwise.",
    )
    group.add_argument(
        "--admission-max-wait-ms",
        type=float,
        default=AdaspecConfig.admission_max_wait_ms,
        metavar="MS",
        help="Aging bound of SLO-aware admission: a request waiting this long goes first "
        "(default: %(default)s).",
    )
    group.add_argument(
        "--adaspec-min-depth",
        type=int,
        default=AdaspecConfig.adaspec_min_depth,
        metavar="D",
        help="adaspec: the drafter never chooses fewer draft steps than this (default: "
        "%(default)s, i.e. it may switch speculation off when its estimate says it does not pay).",
    )
    group.add_argument(
        "--tetris-extra",
        type=int,
        default=AdaspecConfig.tetris_extra,
        metavar="K",
        help="tetris: draft tokens per request beyond its share of the verify capacity; the "
        "capacity is (--speculative-num-steps - K) tokens per request (default: %(default)s).",
    )
    group.add_argument(
        "--tetris-turn-on-batch-size",
        type=int,
        default=AdaspecConfig.tetris_turn_on_batch_size,
        metavar="N",
        help="tetris: batch-wide selection from this many running requests on; below it each "
        "request verifies its capacity share (default: %(default)s).",
    )
    group.add_argument(
        "--faser-lengths",
        type=str,
        default=AdaspecConfig.faser_lengths,
        metavar="L1,L2,...",
        help="faser: candidate speculative lengths (default: 1..--speculative-num-steps).",
    )
    group.add_argument(
        "--faser-window",
        type=int,
        default=AdaspecConfig.faser_window,
        metavar="N",
        help="faser: observations per request in the sliding window (default: %(default)s).",
    )
    group.add_argument(
        "--faser-early-exit",
        nargs="?",
        const="auto",
        default=AdaspecConfig.faser_early_exit,
        metavar="{off,auto,always}",
        help="faser: token-wise early exit inside verification: after --faser-exit-layer layers, "
        "draft tokens outside the intermediate top-K leave the pass with their suffix. auto "
        "(the bare flag): when the expected saving exceeds the test's cost; always: every "
        "verify. LlamaForCausalLM targets with the CPU recipe's torch attention backend; "
        "elsewhere the full pass runs (default: %(default)s).",
    )
    group.add_argument(
        "--faser-exit-layer",
        type=int,
        default=AdaspecConfig.faser_exit_layer,
        metavar="L",
        help="faser: target layers run before the early-exit test (default: half the model; "
        "clipped to 1..layers-1).",
    )
    group.add_argument(
        "--faser-exit-topk",
        type=int,
        default=AdaspecConfig.faser_exit_topk,
        metavar="K",
        help="faser: a draft token exits when K tokens outscore it at the exit layer "
        "(default: %(default)s).",
    )
    group.add_argument(
        "--faser-overlap",
        action="store_true",
        help="faser: draft/verify overlap on GPU SM partitions. NOT AVAILABLE (GPU-only, not "
        "implemented); the flag is refused.",
    )
    group.add_argument(
        "--dropin-variant",
        type=str,
        default=AdaspecConfig.dropin_variant,
        metavar="{mle,fsm,cache-fsm}",
        help="dropin: window rule (default: %(default)s).",
    )
    group.add_argument(
        "--dropin-history",
        type=int,
        default=AdaspecConfig.dropin_history,
        metavar="N",
        help="dropin: verifications per request in the acceptance estimate (default: %(default)s).",
    )


def config_from_namespace(args: argparse.Namespace) -> AdaspecConfig:
    defaults = AdaspecConfig()
    return AdaspecConfig(
        **{
            name: getattr(args, name, getattr(defaults, name))
            for name in (
                "spec_policy",
                "slo_config",
                "adaserve_budget",
                "adaserve_max_nodes_per_request",
                "adaserve_verify_tokens_per_step",
                "adaserve_draft_tokens_per_step",
                "adaserve_budget_rule",
                "draft_tiers",
                "baseline_tpot_ms",
                "slo_admission",
                "admission_max_wait_ms",
                "adaspec_min_depth",
                "tetris_extra",
                "tetris_turn_on_batch_size",
                "faser_lengths",
                "faser_window",
                "faser_early_exit",
                "faser_exit_layer",
                "faser_exit_topk",
                "faser_overlap",
                "dropin_variant",
                "dropin_history",
            )
        }
    )


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
    steps = getattr(server_args, "speculative_num_steps", None)
    if config.spec_policy == "adaspec" and steps is not None and config.adaspec_min_depth > steps:
        raise ConfigError(
            f"--adaspec-min-depth {config.adaspec_min_depth} exceeds --speculative-num-steps "
            f"({steps})"
        )
    if config.spec_policy == "tetris" and steps is not None and steps <= config.tetris_extra:
        raise ConfigError(
            f"--tetris-extra {config.tetris_extra} leaves no verify capacity: it must be below "
            f"--speculative-num-steps ({steps})"
        )
    lengths = config.faser_length_set
    if config.spec_policy == "faser" and lengths and steps is not None and lengths[-1] > steps:
        raise ConfigError(
            f"--faser-lengths {config.faser_lengths} exceeds --speculative-num-steps ({steps})"
        )


def from_cli_args(original, cls, args: argparse.Namespace):
    """AROUND hook on the classmethod `ServerArgs.from_cli_args(args)`."""
    try:
        config = config_from_namespace(args)
        server_args = original(cls, args)
        check_compatible(config, server_args)
        config.load_slo_config()
    except ConfigError as exc:
        print(f"sgl_adaspec: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(EXIT_BAD_FLAGS)
    config.export()
    return server_args
