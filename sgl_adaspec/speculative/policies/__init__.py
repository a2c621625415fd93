"""The registry of speculation policies selectable with `--spec-policy`.

One place lists every policy; later policies add a `PolicySpec` here. Policy implementations are
imported lazily so that parsing flags never imports torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class PolicySpec:
    name: str
    summary: str
    # Whether the policy shapes speculation and therefore needs a tree-drafting algorithm.
    needs_speculation: bool
    # Whether SLO-aware admission (`scheduler/admission.py`) is on unless --slo-admission says.
    slo_admission_by_default: bool = False


POLICIES: dict[str, PolicySpec] = {
    spec.name: spec
    for spec in (
        PolicySpec("static", "SGLang's own speculation, unchanged (the baseline)", False),
        PolicySpec(
            "adaserve",
            "SLO-customized draft trees plus a throughput-optimized global top-k under a budget",
            needs_speculation=True,
            slo_admission_by_default=True,
        ),
        PolicySpec(
            "adaspec",
            "AdaSpec: per-request draft lengths from a fitted latency model and draft confidence, "
            "tail tokens dropped while estimated goodput improves, each request's TPOT SLO checked",
            needs_speculation=True,
        ),
        PolicySpec(
            "tetris",
            "TETRIS: the batch-wide most probable draft tokens up to a verify capacity, with extra "
            "draft tokens per request",
            needs_speculation=True,
        ),
        PolicySpec(
            "faser",
            "FASER: per-request speculative length minimizing cost per committed token (GP-LCB)",
            needs_speculation=True,
        ),
        PolicySpec(
            "dropin",
            "drop-in adaptation: per-request window from an MLE acceptance estimate (or FSM / "
            "cache-FSM variants)",
            needs_speculation=True,
        ),
    )
}

# Speculative algorithms whose drafts are trees the policies can shape.
TREE_ALGORITHMS = ("EAGLE", "EAGLE3", "STANDALONE")


# The policies that shape speculation, in the registry's order: what the evaluation tool and
# the simulator run besides their own baselines.
SHAPING_POLICIES: tuple[str, ...] = tuple(
    name for name, spec in POLICIES.items() if spec.needs_speculation
)


def policy_names() -> list[str]:
    return list(POLICIES)


def get_policy_spec(name: str) -> PolicySpec:
    try:
        return POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown spec policy {name!r}; choose one of: {', '.join(POLICIES)}")


def build_policy(config, budget: int | None = None):
    """The policy object `config.spec_policy` names (None for `static`), with the plugin flags
    applied. `budget`: adaserve's verify budget when the flag left it to the start-up profile."""
    name = config.spec_policy
    common = {"baseline_tpot_ms": config.baseline_tpot_ms}
    if name == "static":
        return None
    if name == "adaserve":
        from sgl_adaspec.speculative.adaptive import AdaptiveTreeConfig
        from sgl_adaspec.speculative.policies.adaserve import AdaserveConfig, AdaservePolicy

        rule = config.adaserve_budget_rule
        # The knee rule takes the profile's knee; the cost rule sizes B itself (a flag caps it).
        knee = budget if config.adaserve_budget is None else config.adaserve_budget
        budget = knee if rule == "knee" or config.adaserve_budget is not None else None
        # B1 is the verifier's tokens per step: the knee (or the flag's B) unless set on its own.
        verify_tokens = config.adaserve_verify_tokens_per_step or knee
        tree = AdaptiveTreeConfig(draft_tokens_per_step=config.adaserve_draft_tokens_per_step)
        if verify_tokens is not None:
            tree = dataclasses.replace(tree, verify_tokens_per_step=verify_tokens)
        return AdaservePolicy(
            AdaserveConfig(
                budget=budget,
                max_nodes_per_request=config.adaserve_max_nodes_per_request,
                budget_rule=rule,
                tree=tree,
                **common,
            )
        )
    if name == "adaspec":
        from sgl_adaspec.speculative.policies.adaspec import AdaspecPolicy, AdaspecPolicyConfig

        return AdaspecPolicy(AdaspecPolicyConfig(min_depth=config.adaspec_min_depth, **common))
    if name == "tetris":
        from sgl_adaspec.speculative.policies.tetris import TetrisConfig, TetrisPolicy

        return TetrisPolicy(
            TetrisConfig(
                extra=config.tetris_extra,
                turn_on_batch_size=config.tetris_turn_on_batch_size,
                **common,
            )
        )
    if name == "faser":
        from sgl_adaspec.speculative.policies.faser import FaserConfig, FaserPolicy

        return FaserPolicy(
            FaserConfig(
                lengths=config.faser_length_set,
                window=config.faser_window,
                early_exit=config.faser_early_exit,
                exit_layer=config.faser_exit_layer,
                exit_topk=config.faser_exit_topk,
                **common,
            )
        )
    if name == "dropin":
        from sgl_adaspec.speculative.policies.dropin import (
            DropinConfig,
            DropinPolicy,
            DropinVariant,
        )

        return DropinPolicy(
            DropinConfig(
                variant=DropinVariant(config.dropin_variant),
                history=config.dropin_history,
                **common,
            )
        )
    raise KeyError(f"no policy implementation for {name!r}")
