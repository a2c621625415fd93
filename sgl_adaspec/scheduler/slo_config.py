"""SLO classes: named TPOT targets loaded from YAML (`sgl_adaspec/data/slo_classes.yaml`,
`--slo-config`).

A class states its TPOT SLO either absolutely (`tpot_ms`) or as a multiple of the measured
baseline TPOT without speculation (`baseline_multiple`). `default` names the class of requests
that state no SLO; `best_effort` (no target) unless configured. Errors name the file and line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from sgl_adaspec.flags import ConfigError

BEST_EFFORT = "best_effort"
# A TPOT above this is not a latency objective (one token per minute): a typo, most likely.
MAX_TPOT_MS = 60_000.0
# Shipped in the package: a plain (non-editable) install has no repository beside it.
DEFAULT_SLO_CONFIG = Path(__file__).resolve().parents[1] / "data" / "slo_classes.yaml"


@dataclass(frozen=True)
class SloClass:
    name: str
    tpot_ms: float | None = None
    baseline_multiple: float | None = None

    def __post_init__(self) -> None:
        if (self.tpot_ms is None) == (self.baseline_multiple is None):
            raise ValueError(f"class {self.name!r} needs exactly one of tpot_ms, baseline_multiple")
        if self.tpot_ms is not None:
            check_tpot_ms(self.tpot_ms, f"class {self.name!r} tpot_ms")
        if self.baseline_multiple is not None:
            value = self.baseline_multiple
            if not _is_number(value) or not math.isfinite(value) or not 0 < value <= 1000:
                raise ValueError(
                    f"class {self.name!r} baseline_multiple must be a number in (0, 1000], "
                    f"got {value!r}"
                )

    def resolve_ms(self, baseline_tpot_ms: float | None) -> float | None:
        """The class's TPOT target in ms; None for a relative class while no baseline is known."""
        if self.tpot_ms is not None:
            return float(self.tpot_ms)
        if baseline_tpot_ms is None:
            return None
        return self.baseline_multiple * baseline_tpot_ms


@dataclass(frozen=True)
class SloConfig:
    classes: dict[str, SloClass]
    default: str = BEST_EFFORT

    def __post_init__(self) -> None:
        if self.default != BEST_EFFORT and self.default not in self.classes:
            raise ValueError(
                f"default class {self.default!r} is not defined "
                f"(classes: {', '.join(self.classes) or 'none'})"
            )


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_tpot_ms(value, what: str) -> float:
    """A latency target in ms must be a finite number in (0, MAX_TPOT_MS]; raises ValueError
    naming it (used for TPOT and TTFT targets alike)."""
    if not _is_number(value):
        raise ValueError(f"{what} must be a number of milliseconds, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be > 0 and finite, got {value!r}")
    if value > MAX_TPOT_MS:
        raise ValueError(f"{what} must be at most {MAX_TPOT_MS:g} ms, got {value!r}")
    return float(value)


def load_slo_config(path: Path) -> SloConfig:
    """Parse and validate an SLO config file; ConfigError messages start with `file:line:`."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read SLO config: {exc.strerror}") from exc
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"{mark.line + 1}:" if mark is not None else ""
        raise ConfigError(f"{path}:{line} invalid YAML: {getattr(exc, 'problem', exc)}") from exc

    def fail(node, message: str) -> ConfigError:
        return ConfigError(f"{path}:{node.start_mark.line + 1}: {message}")

    if root is None:
        raise ConfigError(f"{path}: empty SLO config")
    if not isinstance(root, yaml.MappingNode):
        raise fail(root, "expected a mapping with 'classes' and optional 'default'")
    top = {key.value: value for key, value in root.value}
    unknown = set(top) - {"classes", "default"}
    if unknown:
        node = next(k for k, _ in root.value if k.value in unknown)
        raise fail(node, f"unknown key {node.value!r} (expected 'classes', 'default')")
    classes_node = top.get("classes")
    if not isinstance(classes_node, yaml.MappingNode):
        raise fail(classes_node or root, "'classes' must be a mapping of class name to settings")
    classes = {}
    for name_node, spec_node in classes_node.value:
        if not isinstance(spec_node, yaml.MappingNode):
            raise fail(spec_node, f"class {name_node.value!r} must be a mapping")
        settings = yaml.safe_load(yaml.serialize(spec_node))
        extra = set(settings) - {"tpot_ms", "baseline_multiple"}
        if extra:
            raise fail(spec_node, f"class {name_node.value!r}: unknown keys {sorted(extra)}")
        try:
            classes[name_node.value] = SloClass(name_node.value, **settings)
        except ValueError as exc:
            raise fail(spec_node, str(exc)) from exc
    default_node = top.get("default")
    default = BEST_EFFORT if default_node is None else default_node.value
    try:
        return SloConfig(classes, default)
    except ValueError as exc:
        raise fail(default_node or root, str(exc)) from exc
