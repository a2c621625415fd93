"""The registry of speculation policies selectable with `--spec-policy`.

One place lists every policy; later policies add a `PolicySpec` here. A policy's flags are the
`flags.flag` fields of its config dataclass (options `--<name>-<field>`), from which the CLI, the
checks and the config carrier are derived. Policy implementations are imported lazily, so that
the registry itself imports nothing heavy.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class PolicySpec:
    name: str
    summary: str
    # Whether the policy shapes speculation and therefore needs a tree-drafting algorithm.
    needs_speculation: bool
    # Whether SLO-aware admission (`scheduler/admission.py`) is on unless --slo-admission says.
    slo_admission_by_default: bool = False
    # The policy's config dataclass (its flags) and the policy, built as Policy(Config(...)):
    # "module:Class" in this package or "sgl_adaspec.<path>:Class" (imported when first asked
    # for), or the class. None: a policy without an implementation here (static).
    config: str | type | None = None
    policy: str | type | None = None

    def config_class(self) -> type | None:
        return _load(self.config)

    def policy_class(self) -> type | None:
        return _load(self.policy)


def _load(path: str | type | None) -> type | None:
    if path is None or isinstance(path, type):
        return path
    module, name = path.split(":")
    if not module.startswith("sgl_adaspec."):
        module = f"{__name__}.{module}"
    return getattr(importlib.import_module(module), name)


POLICIES: dict[str, PolicySpec] = {
    spec.name: spec
    for spec in (
        PolicySpec("static", "SGLang's own speculation, unchanged (the baseline)", False),
        PolicySpec(
            "adaserve",
            "SLO-customized draft trees plus a throughput-optimized global top-k under a budget",
            needs_speculation=True,
            slo_admission_by_default=True,
            config="sgl_adaspec.speculative.adaserve.config:AdaserveConfig",
            policy="sgl_adaspec.speculative.adaserve.policy:AdaservePolicy",
        ),
        PolicySpec(
            "adaspec",
            "AdaSpec: per-request draft lengths from a fitted latency model and draft confidence, "
            "tail tokens dropped while estimated goodput improves, each request's TPOT SLO checked",
            needs_speculation=True,
            config="adaspec:AdaspecPolicyConfig",
            policy="adaspec:AdaspecPolicy",
        ),
        PolicySpec(
            "tetris",
            "TETRIS: the batch-wide most probable draft tokens up to a verify capacity, with extra "
            "draft tokens per request",
            needs_speculation=True,
            config="tetris:TetrisConfig",
            policy="tetris:TetrisPolicy",
        ),
        PolicySpec(
            "faser",
            "FASER: per-request speculative length minimizing cost per committed token (GP-LCB)",
            needs_speculation=True,
            config="faser:FaserConfig",
            policy="faser:FaserPolicy",
        ),
        PolicySpec(
            "dropin",
            "drop-in adaptation: per-request window from an MLE acceptance estimate (or FSM / "
            "cache-FSM variants)",
            needs_speculation=True,
            config="dropin:DropinConfig",
            policy="dropin:DropinPolicy",
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
    """The policy object `config.spec_policy` names (None for `static`): its config
    (`config.policy_config`, the flags) with --baseline-tpot-ms applied, completed by the
    config's `with_profile_budget(budget)` where it has one (adaserve: `budget` is the verify
    budget of the start-up profile, for what the flags left to it)."""
    spec = get_policy_spec(config.spec_policy)
    policy_class = spec.policy_class()
    if policy_class is None:
        return None
    policy_config = dataclasses.replace(
        config.policy_config, baseline_tpot_ms=config.baseline_tpot_ms
    )
    complete = getattr(policy_config, "with_profile_budget", None)
    if complete is not None:
        policy_config = complete(budget)
    return policy_class(policy_config)
