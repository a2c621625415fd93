"""Speculation policies the bench can start a server with, by name.

Every recipe serves the same target model; only the speculation flags differ:

* ``none``: no speculation.
* ``static``: EAGLE tree (steps, topk, draft tokens) and ``--spec-policy static`` (SGLang as is).
* ``sglang-adaptive``: SGLang's ``--speculative-adaptive``: EAGLE with topk 1 (the only width it
  supports) and ``steps + 1`` draft tokens; SGLang moves the steps among its candidate steps
  (1, 3, 5, 7 by default) from the observed acceptance. ``steps`` must be one of them.
* the plugin's policies that shape speculation (the registry's ``SHAPING_POLICIES``: today
  ``adaserve``, ``adaspec``, ``tetris``, ``faser``, ``dropin``): EAGLE tree and
  ``--spec-policy NAME`` (every plugin policy needs topk >= 2: it reads the tree's
  probabilities; chain policies verify its most probable chain).
* ``adaserve-fcfs``: adaserve with SLO-aware admission and prefill bounding off
  (``--slo-admission off``), SGLang's own admission order: the scheduling comparison.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sgl_adaspec.adapters.cli import check_policy_shape
from sgl_adaspec.local_server.launch import eagle_flags
from sgl_adaspec.speculative.policies import SHAPING_POLICIES


@dataclass(frozen=True)
class SpecShape:
    """The draft tree of the speculative recipes (SGLang's three EAGLE flags)."""

    steps: int = 3
    topk: int = 4
    num_draft_tokens: int = 8

    def __post_init__(self) -> None:
        if self.steps < 1 or self.topk < 1 or self.num_draft_tokens < 2:
            raise ValueError(f"invalid speculation shape {self}")


@dataclass(frozen=True)
class PolicyRecipe:
    name: str
    summary: str
    flags: Callable[[Path, SpecShape], tuple[str, ...]]
    # server_info field that must read True once started (SGLang may switch a feature off with
    # only a warning), with the log line prefix that says why.
    must_be_on: str | None = None
    off_reason_prefix: str | None = None
    # The plugin policy (`--spec-policy`, one of the registry's SHAPING_POLICIES) the server runs,
    # None for the baselines: such a server takes --baseline-tpot-ms to resolve SLO classes.
    plugin_policy: str | None = None


def _none(draft: Path, shape: SpecShape) -> tuple[str, ...]:
    return ()


def _static(draft: Path, shape: SpecShape) -> tuple[str, ...]:
    tree = eagle_flags(draft, shape.steps, shape.topk, shape.num_draft_tokens)
    return (*tree, "--spec-policy", "static")


def _sglang_adaptive(draft: Path, shape: SpecShape) -> tuple[str, ...]:
    # SGLang 0.5.23 adaptive speculation supports topk 1 only and sets draft tokens = steps + 1.
    chain = eagle_flags(draft, shape.steps, 1, shape.steps + 1)
    return (*chain, "--speculative-adaptive")


def _plugin_policy(name: str, *extra: str) -> Callable[[Path, SpecShape], tuple[str, ...]]:
    def flags(draft: Path, shape: SpecShape) -> tuple[str, ...]:
        tree = eagle_flags(draft, shape.steps, shape.topk, shape.num_draft_tokens)
        return (*tree, "--spec-policy", name, *extra)

    return flags


def _plugin_recipe(name: str, summary: str, policy: str, *extra: str) -> PolicyRecipe:
    """EAGLE tree and `--spec-policy policy`, plus `extra` flags."""
    return PolicyRecipe(name, summary, _plugin_policy(policy, *extra), plugin_policy=policy)


# The plugin's policies, from the registry (`--spec-policy NAME`); LAUNCH_RECIPES adds the bench's
# baselines (NO_SPECULATION, "static", "sglang-adaptive") and its variant "adaserve-fcfs".
NO_SPECULATION = "none"


LAUNCH_RECIPES: dict[str, PolicyRecipe] = {
    recipe.name: recipe
    for recipe in (
        PolicyRecipe(NO_SPECULATION, "no speculation", _none),
        PolicyRecipe("static", "EAGLE tree, SGLang's own speculation", _static),
        PolicyRecipe(
            "sglang-adaptive",
            "SGLang --speculative-adaptive (EAGLE chain, topk 1)",
            _sglang_adaptive,
            must_be_on="speculative_adaptive",
            off_reason_prefix="speculative_adaptive disabled:",
        ),
        *(
            _plugin_recipe(name, f"EAGLE tree, --spec-policy {name}", name)
            for name in SHAPING_POLICIES
        ),
        _plugin_recipe(
            "adaserve-fcfs",
            "adaserve with SGLang's admission order (--slo-admission off)",
            "adaserve",
            "--slo-admission",
            "off",
        ),
    )
}


def get_policy(name: str) -> PolicyRecipe:
    try:
        return LAUNCH_RECIPES[name]
    except KeyError:
        raise ValueError(
            f"unknown policy {name!r}; choose from: {', '.join(LAUNCH_RECIPES)}"
        ) from None


def check_shape(recipe: PolicyRecipe, shape: SpecShape) -> None:
    """A plugin policy's recipe against the draft's shape, by the launcher's own checks, so a
    shape its server would refuse fails before any server starts (ValueError)."""
    if recipe.plugin_policy is None:
        return
    try:
        check_policy_shape(recipe.plugin_policy, shape.steps, shape.topk, shape.num_draft_tokens)
    except ValueError as exc:
        raise ValueError(f"policy {recipe.name}: {exc}") from None


def is_speculative(name: str) -> bool:
    return name != NO_SPECULATION
