"""SLO class files: the shipped one loads; malformed ones fail with file and line."""

from __future__ import annotations

import pytest

from sgl_adaspec.config import ConfigError
from sgl_adaspec.scheduler.slo_config import (
    BEST_EFFORT,
    DEFAULT_SLO_CONFIG,
    SloClass,
    load_slo_config,
)


def test_shipped_config_has_the_papers_three_classes():
    config = load_slo_config(DEFAULT_SLO_CONFIG)
    assert config.classes == {
        "coding": SloClass("coding", baseline_multiple=1.2),
        "chat": SloClass("chat", tpot_ms=50),
        "summarization": SloClass("summarization", tpot_ms=150),
    }
    assert config.default == BEST_EFFORT
    assert config.classes["coding"].resolve_ms(20.0) == pytest.approx(24.0)
    assert config.classes["coding"].resolve_ms(None) is None


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("classes:\n  chat:\n    tpot_ms: -3\n", 3, "tpot_ms must be > 0"),
        ("classes:\n  chat:\n    tpot_ms: fast\n", 3, "must be a number"),
        ("classes:\n  chat:\n    tpot_ms: 50\n    baseline_multiple: 2\n", 3, "exactly one"),
        ("classes:\n  chat: {tpot_ms: 50}\ndefault: gold\n", 3, "default class 'gold'"),
        ("classes:\n  chat: {tpot_ms: 50, color: red}\n", 2, "unknown keys ['color']"),
        ("classes: [1, 2]\n", 1, "'classes' must be a mapping"),
        ("classes:\n  chat: {tpot_ms: 50\n", 3, "invalid YAML"),
        ("clases:\n  chat: {tpot_ms: 50}\n", 1, "unknown key 'clases'"),
    ],
)
def test_malformed_config_names_file_and_line(tmp_path, text, line, message):
    path = tmp_path / "slo.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_slo_config(path)
    assert str(err.value).startswith(f"{path}:{line}:"), str(err.value)
    assert message in str(err.value)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read SLO config"):
        load_slo_config(tmp_path / "absent.yaml")
