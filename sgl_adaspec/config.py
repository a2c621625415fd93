"""Configuration of the plugin: one frozen dataclass, the single home of defaults.

The values parsed from `python -m sglang.launch_server ... --spec-policy NAME` must reach SGLang's
scheduler process, which multiprocessing *spawns* (a fresh interpreter). SGLang's own
`ServerArgs.from_cli_args` keeps only its dataclass fields, so the plugin carries its config in one
environment variable, `ADASPEC_CONFIG` (JSON), set in the launcher and inherited by every child.
The name avoids the `SGL_`/`SGLANG_` prefixes that SGLang reserves for itself.

Every flag is a dataclass field declared with `flags.flag` (default, help, checks): the common
flags below, and each policy's flags on its own config dataclass (`PolicySpec.config`, options
`--<policy>-<field>`). The argparse group (`cli.py`), the conversion of parsed values, the checks
and the JSON carrier are all derived from those declarations.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from sgl_adaspec.flags import (
    ConfigError,
    check_flags,
    dest,
    dump_flags,
    flag,
    flag_fields,
    flag_values,
    option,
)
from sgl_adaspec.speculative.policies import POLICIES, TREE_ALGORITHMS, get_policy_spec

__all__ = ["CONFIG_ENV", "AdaspecConfig", "ConfigError"]

CONFIG_ENV = "ADASPEC_CONFIG"


def _check_spec_policy(value: str, label: str) -> None:
    if value not in POLICIES:
        raise ConfigError(f"unknown {label} {value!r}; choose one of: {', '.join(POLICIES)}")


def _check_tpot_ms(value: float, label: str) -> None:
    from sgl_adaspec.scheduler.slo_config import check_tpot_ms

    check_tpot_ms(value, label)


def _check_positive(value: float, label: str) -> None:
    if not value > 0:
        raise ConfigError(f"{label} must be > 0, got {value}")


def _check_log_path(value: str | None, label: str) -> None:
    if value is not None and not Path(value).expanduser().resolve().parent.is_dir():
        raise ConfigError(f"{label}: the folder of {value!r} does not exist")


_POLICY_HELP = "; ".join(f"{p.name}: {p.summary}" for p in POLICIES.values())


@dataclass(frozen=True)
class AdaspecConfig:
    """Plugin flags. Common flags are fields named as their options (`spec_policy` <->
    `--spec-policy`); the chosen policy's flags are its config dataclass, `policy_config`.
    `AdaspecConfig.of(tetris_extra=2, ...)` builds one from flat option names."""

    spec_policy: str = flag(
        "static",
        f"Speculation policy (default: %(default)s). {_POLICY_HELP}. Every policy except "
        f"'static' needs --speculative-algorithm one of {', '.join(TREE_ALGORITHMS)}.",
        metavar="{" + ",".join(POLICIES) + "}",
        check=_check_spec_policy,
    )
    slo_config: str | None = flag(
        None,
        "YAML file of TPOT SLO classes that requests name with custom_params.slo_class "
        "(default: the package's sgl_adaspec/data/slo_classes.yaml).",
        metavar="PATH",
    )
    draft_tiers: str = flag(
        "on",
        "on: each iteration runs in a draft tier, one of a few (depth, width) shapes of the "
        "draft's beam search built at start-up as SGLang runtime states (fewer, narrower draft "
        "steps and fewer verified nodes under load); on CUDA only with --gpu-draft-tiers on. "
        "off: always the configured search (default: %(default)s).",
        choices=("on", "off"),
    )
    draft_tier_limit: int = flag(
        16,
        "Draft tiers built besides the configured search, cheapest first, steps 0 included "
        "(default: %(default)s).",
        metavar="N",
        minimum=0,
    )
    draft_tier_memory_gb: float | None = flag(
        None,
        "Stop building draft tiers once their CUDA graphs take more device memory than this "
        "(default: no cap; the startup log reports what they took).",
        metavar="GB",
        check=_check_positive,
    )
    draft_tier_capture_s: float | None = flag(
        None,
        "Stop building draft tiers once building them (their CUDA graph captures) has taken "
        "longer than this many seconds (default: no cap; the startup log reports what they "
        "took).",
        metavar="S",
        check=_check_positive,
    )
    gpu_draft_tiers: str = flag(
        "off",
        "on: build the draft tiers on CUDA too, each capturing its draft, draft-extend and "
        "verify graphs (not yet validated on a GPU). off: on CUDA the configured search runs "
        "and the policy narrows only what is verified (default: %(default)s).",
        choices=("on", "off"),
    )
    baseline_tpot_ms: float | None = flag(
        None,
        "TPOT without speculation, for SLO classes stated as a multiple of it (default: "
        "estimated online from the target's verify-pass latency).",
        metavar="MS",
        check=_check_tpot_ms,
    )
    slo_admission: str = flag(
        "auto",
        "Admit waiting requests by urgency (least slack against custom_params.ttft_slo_ms, "
        "with aging) instead of SGLang's order. auto: on for adaserve, off otherwise.",
        choices=("auto", "on", "off"),
    )
    admission_max_wait_ms: float = flag(
        2000.0,
        "Aging bound of SLO-aware admission: a request waiting this long goes first "
        "(default: %(default)s).",
        metavar="MS",
        check=_check_positive,
    )
    slo_dispatch: str = flag(
        "off",
        "With --dp N: on sends each request to the replica where its TPOT SLO is most likely "
        "met without costing the requests there theirs, from each replica's SLO state and "
        "latency model; off leaves it to SGLang's --load-balance-method (default: %(default)s).",
        choices=("off", "on"),
    )
    spec_observe_lag: str = flag(
        "auto",
        "Iterations a speculative iteration's outcome waits before the policy learns from it: "
        "0, as it ends (its results read on the host then); 1, when the next one ends, so "
        "the next iteration is planned and launched without waiting for the device, as "
        "SGLang's overlap scheduler launches it. auto: 1 on CUDA with the overlap schedule, "
        "else 0 (default: %(default)s).",
        choices=("auto", "0", "1"),
    )
    spec_decision_log: str | None = flag(
        None,
        "Append one JSON line per decode iteration to this file: the draft shape that ran, "
        "what it verified, committed and took, and why the policy chose it (the plan, the "
        "fits and the track record behind it; adaserve). Off by default.",
        metavar="PATH",
        check=_check_log_path,
    )
    # The chosen policy's config dataclass, holding its flags (None: its defaults; always None
    # for a policy without one, `static`). Only its flag fields travel in ADASPEC_CONFIG.
    policy_config: Any = field(default=None)

    def __post_init__(self) -> None:
        check_flags(self)
        config_class = get_policy_spec(self.spec_policy).config_class()
        if config_class is None:
            if self.policy_config is not None:
                raise ConfigError(f"--spec-policy {self.spec_policy} has no policy config")
        elif self.policy_config is None:
            object.__setattr__(self, "policy_config", config_class())
        elif not isinstance(self.policy_config, config_class):
            raise ConfigError(
                f"--spec-policy {self.spec_policy} takes a {config_class.__name__}, got "
                f"{type(self.policy_config).__name__}"
            )

    @property
    def slo_admission_active(self) -> bool:
        if self.slo_admission == "auto":
            return get_policy_spec(self.spec_policy).slo_admission_by_default
        return self.slo_admission == "on"

    @property
    def slo_config_path(self) -> Path:
        from sgl_adaspec.scheduler.slo_config import DEFAULT_SLO_CONFIG

        return Path(self.slo_config) if self.slo_config else DEFAULT_SLO_CONFIG

    def load_slo_config(self):
        """The SLO classes (parsed once per process); ConfigError names file and line."""
        from sgl_adaspec.scheduler.slo_config import load_slo_config

        return _cached_slo_config(str(self.slo_config_path), load_slo_config)

    def to_json(self) -> str:
        """The flags, keyed by argparse destination (`tetris_extra`): the common ones and the
        chosen policy's."""
        values = dump_flags(self)
        if self.policy_config is not None:
            values.update(dump_flags(self.policy_config, self.spec_policy))
        return json.dumps(values, sort_keys=True)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> AdaspecConfig:
        """The config of flag values keyed by argparse destination (`spec_policy`,
        `tetris_extra`; text or JSON values, as the command line or `to_json` give them). Every
        value is checked; a flag of a policy other than `spec_policy` must keep its default."""
        values = dict(values)
        config_classes = {
            spec.name: spec.config_class()
            for spec in POLICIES.values()
            if any(key.startswith(f"{spec.name}_") for key in values)
        }
        known = {f.name for f in flag_fields(cls)}
        for name, config_class in config_classes.items():
            if config_class is not None:
                known.update(dest(name, f.name) for f in flag_fields(config_class))
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown sgl_adaspec config keys: {', '.join(unknown)}")
        common = flag_values(values, cls)
        chosen = common.get("spec_policy", cls.spec_policy)
        policy_config = None
        for name, config_class in config_classes.items():
            if config_class is None:
                continue
            given = flag_values(values, config_class, name)
            if name == chosen:
                policy_config = _build(config_class, given)
                continue
            defaults = {f.name: f.default for f in flag_fields(config_class)}
            for field_name, value in given.items():
                if value != defaults[field_name]:
                    raise ConfigError(
                        f"{option(name, field_name)} is part of --spec-policy {name} (got "
                        f"--spec-policy {chosen})"
                    )
        return cls(**common, policy_config=policy_config)

    @classmethod
    def of(cls, **values: Any) -> AdaspecConfig:
        """`from_mapping` with keywords: `AdaspecConfig.of(spec_policy="tetris", tetris_extra=2)`."""
        return cls.from_mapping(values)

    def export(self) -> None:
        """Publish this config to child processes (see module docstring)."""
        os.environ[CONFIG_ENV] = self.to_json()

    @classmethod
    def from_env(cls) -> AdaspecConfig:
        """The config published by the launcher, or the defaults when none was published.
        Parsed and checked once per distinct value (hooks ask for it on every request)."""
        return _parse_env_config(cls, os.environ.get(CONFIG_ENV) or "")

    @classmethod
    def _from_json(cls, raw: str) -> AdaspecConfig:
        if not raw:
            return cls()
        try:
            values = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{CONFIG_ENV} is not valid JSON: {exc}") from exc
        if not isinstance(values, dict):
            raise ConfigError(f"{CONFIG_ENV} must be a JSON object, got {raw[:80]!r}")
        return cls.from_mapping(values)


def _build(config_class: type, values: dict[str, Any]):
    try:
        return config_class(**values)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from exc


@lru_cache(maxsize=4)
def _parse_env_config(cls, raw: str) -> AdaspecConfig:
    return cls._from_json(raw)


@lru_cache(maxsize=4)
def _cached_slo_config(path: str, loader):
    return loader(Path(path))
