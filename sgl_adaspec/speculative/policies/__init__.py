"""The registry of speculation policies selectable with `--spec-policy`.

One place lists every policy; later policies add a `PolicySpec` here. Policy implementations are
imported lazily so that parsing flags never imports torch.
"""

from __future__ import annotations

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
    )
}

# Speculative algorithms whose drafts are trees the policies can shape.
TREE_ALGORITHMS = ("EAGLE", "EAGLE3", "STANDALONE")


def policy_names() -> list[str]:
    return list(POLICIES)


def get_policy_spec(name: str) -> PolicySpec:
    try:
        return POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown spec policy {name!r}; choose one of: {', '.join(POLICIES)}")
