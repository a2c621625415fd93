"""Configuration of the plugin: one frozen dataclass, the single home of defaults.

The values parsed from `python -m sglang.launch_server ... --spec-policy NAME` must reach SGLang's
scheduler process, which multiprocessing *spawns* (a fresh interpreter). SGLang's own
`ServerArgs.from_cli_args` keeps only its dataclass fields, so the plugin carries its config in one
environment variable, `ADASPEC_CONFIG` (JSON), set in the launcher and inherited by every child.
The name avoids the `SGL_`/`SGLANG_` prefixes that SGLang reserves for itself.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

# faser's token-wise early exit: never, when eq. 10 says it pays, on every verify.
EARLY_EXIT_MODES = ("off", "auto", "always")

CONFIG_ENV = "ADASPEC_CONFIG"


class ConfigError(ValueError):
    """A plugin flag or flag combination that cannot work; the message names the problem."""


@dataclass(frozen=True)
class AdaspecConfig:
    """Plugin flags. Field names match the CLI flags (`spec_policy` <-> `--spec-policy`)."""

    spec_policy: str = "static"
    # None: the repository's configs/slo_classes.yaml.
    slo_config: str | None = None
    # Verified tokens per iteration, roots included (None: no budget pressure).
    adaserve_budget: int | None = None
    # n_max: most candidates the SLO phase gives one request (None: all of its candidates).
    adaserve_max_nodes_per_request: int | None = None
    # adaserve eq. 8-9: verify tokens (B1; None: the verify budget B) and draft tokens (B2) per
    # step for the whole batch.
    adaserve_verify_tokens_per_step: int | None = None
    adaserve_draft_tokens_per_step: int = 64
    # adaserve's budget rule: "cost" (B, d and speculation itself from measured costs and
    # calibrated acceptance) or "knee" (the paper's: B at the profile's knee, d from eq. 8).
    adaserve_budget_rule: str = "cost"
    # Run the draft at the policy's (depth, width) where supported ("on"), or always at the
    # configured --speculative-num-steps / --speculative-eagle-topk ("off").
    draft_tiers: str = "on"
    # TPOT without speculation (ms) for relative SLO classes (None: estimated online).
    baseline_tpot_ms: float | None = None
    # SLO-aware admission of waiting requests: "auto" (the policy's default), "on", "off".
    slo_admission: str = "auto"
    # Aging bound of SLO-aware admission: no request waits longer for others' urgency.
    admission_max_wait_ms: float = 2000.0
    # adaspec: floor on the drafter's depth (0: it may switch speculation off).
    adaspec_min_depth: int = 0
    # tetris: draft tokens per request beyond its share of the verify capacity, and the batch
    # size from which batch-wide selection starts.
    tetris_extra: int = 1
    tetris_turn_on_batch_size: int = 1
    # faser: candidate speculative lengths ("1,2,4"; None: 1..num-steps), observations kept.
    faser_lengths: str | None = None
    faser_window: int = 16
    # faser's token-wise early exit in verification: off / auto / always, where, and K.
    faser_early_exit: str = "off"
    faser_exit_layer: int | None = None
    faser_exit_topk: int = 10
    # faser's draft/verify overlap (not available, see --help).
    faser_overlap: bool = False
    # dropin: "mle", "fsm" or "cache-fsm"; verifications in the acceptance estimate.
    dropin_variant: str = "mle"
    dropin_history: int = 8

    def __post_init__(self) -> None:
        from sgl_adaspec.speculative.policies import policy_names

        if self.spec_policy not in policy_names():
            raise ConfigError(
                f"unknown --spec-policy {self.spec_policy!r}; "
                f"choose one of: {', '.join(policy_names())}"
            )

        for name in (
            "adaserve_budget", "adaserve_max_nodes_per_request",
            "adaserve_verify_tokens_per_step", "adaserve_draft_tokens_per_step",
        ):  # fmt: skip
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"--{name.replace('_', '-')} must be an integer, got {value!r}")
        for name in ("adaserve_verify_tokens_per_step", "adaserve_draft_tokens_per_step"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.adaserve_budget_rule not in ("cost", "knee"):
            raise ConfigError(
                f"--adaserve-budget-rule must be cost or knee, got {self.adaserve_budget_rule!r}"
            )
        if self.draft_tiers not in ("on", "off"):
            raise ConfigError(f"--draft-tiers must be on or off, got {self.draft_tiers!r}")
        if self.adaserve_budget is not None and self.adaserve_budget < 1:
            raise ConfigError(f"--adaserve-budget must be >= 1, got {self.adaserve_budget}")
        n_max = self.adaserve_max_nodes_per_request
        if n_max is not None and n_max < 0:
            raise ConfigError(f"--adaserve-max-nodes-per-request must be >= 0, got {n_max}")

        if self.baseline_tpot_ms is not None:
            from sgl_adaspec.scheduler.slo_config import check_tpot_ms

            try:
                check_tpot_ms(self.baseline_tpot_ms, "--baseline-tpot-ms")
            except ValueError as exc:
                raise ConfigError(str(exc)) from exc

        if self.slo_admission not in ("auto", "on", "off"):
            raise ConfigError(f"--slo-admission must be auto, on or off, got {self.slo_admission!r}")
        if not self.admission_max_wait_ms > 0:
            raise ConfigError(
                f"--admission-max-wait-ms must be > 0, got {self.admission_max_wait_ms}"
            )

        self._check_policy_flags()

    def _check_policy_flags(self) -> None:
        names = (
            "adaspec_min_depth", "tetris_extra", "tetris_turn_on_batch_size", "faser_window",
            "dropin_history",
        )  # fmt: skip
        for name in names:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"--{name.replace('_', '-')} must be an integer, got {value!r}")
        if self.adaspec_min_depth < 0:
            raise ConfigError(f"--adaspec-min-depth must be >= 0, got {self.adaspec_min_depth}")
        if self.tetris_extra < 0:
            raise ConfigError(f"--tetris-extra must be >= 0, got {self.tetris_extra}")
        for name in ("tetris_turn_on_batch_size", "faser_window", "dropin_history"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        self.faser_length_set  # parses, or raises ConfigError
        if self.faser_early_exit not in EARLY_EXIT_MODES:
            raise ConfigError(
                f"--faser-early-exit must be one of {', '.join(EARLY_EXIT_MODES)}, got "
                f"{self.faser_early_exit!r}"
            )
        if self.faser_early_exit != "off" and self.spec_policy != "faser":
            raise ConfigError(
                f"--faser-early-exit is part of --spec-policy faser (got --spec-policy "
                f"{self.spec_policy})"
            )
        for name in ("faser_exit_layer", "faser_exit_topk"):
            value = getattr(self, name)
            if value is None and name == "faser_exit_layer":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be an integer >= 1, got {value!r}")
        if self.faser_overlap:
            raise ConfigError(
                "--faser-overlap is not available: overlapping draft and verify needs GPU SM "
                "partitions (CUDA green contexts), which this build does not implement"
            )
        variants = ("mle", "fsm", "cache-fsm")
        if self.dropin_variant not in variants:
            raise ConfigError(
                f"--dropin-variant must be one of {', '.join(variants)}, got {self.dropin_variant!r}"
            )

    @property
    def faser_length_set(self) -> tuple[int, ...] | None:
        """--faser-lengths as ascending distinct ints (None: the policy's default)."""
        if self.faser_lengths is None:
            return None
        try:
            lengths = tuple(sorted({int(part) for part in str(self.faser_lengths).split(",")}))
        except ValueError:
            raise ConfigError(
                f"--faser-lengths must be comma-separated integers like 1,2,4, got "
                f"{self.faser_lengths!r}"
            ) from None
        if not lengths or lengths[0] < 1:
            raise ConfigError(f"--faser-lengths must be >= 1 each, got {self.faser_lengths!r}")
        return lengths

    @property
    def slo_admission_active(self) -> bool:
        from sgl_adaspec.speculative.policies import get_policy_spec

        if self.slo_admission == "auto":
            return get_policy_spec(self.spec_policy).slo_admission_by_default
        return self.slo_admission == "on"

    @property
    def slo_config_path(self) -> Path:
        from sgl_adaspec.scheduler.slo_config import REPO_SLO_CONFIG

        return Path(self.slo_config) if self.slo_config else REPO_SLO_CONFIG

    def load_slo_config(self):
        """The SLO classes (parsed once per process); ConfigError names file and line."""
        from sgl_adaspec.scheduler.slo_config import load_slo_config

        return _cached_slo_config(str(self.slo_config_path), load_slo_config)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "AdaspecConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown sgl_adaspec config keys: {', '.join(unknown)}")
        return cls(**dict(values))

    def export(self) -> None:
        """Publish this config to child processes (see module docstring)."""
        os.environ[CONFIG_ENV] = self.to_json()

    @classmethod
    def from_env(cls) -> "AdaspecConfig":
        """The config published by the launcher, or the defaults when none was published.
        Parsed and checked once per distinct value (hooks ask for it on every request)."""
        return _parse_env_config(cls, os.environ.get(CONFIG_ENV) or "")

    @classmethod
    def _from_json(cls, raw: str) -> "AdaspecConfig":
        if not raw:
            return cls()
        try:
            values = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{CONFIG_ENV} is not valid JSON: {exc}") from exc
        return cls.from_mapping(values)


@lru_cache(maxsize=4)
def _parse_env_config(cls, raw: str) -> AdaspecConfig:
    return cls._from_json(raw)


@lru_cache(maxsize=4)
def _cached_slo_config(path: str, loader):
    return loader(Path(path))
