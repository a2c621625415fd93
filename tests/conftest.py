"""Shared fixtures: the tiny local models (built once into the user cache, deterministic)."""

from __future__ import annotations

import pytest

from sgl_adaspec.models.tiny import TinyModels, ensure_models


@pytest.fixture(scope="session")
def models() -> TinyModels:
    return ensure_models()
