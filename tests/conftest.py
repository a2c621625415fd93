"""Shared fixtures: the tiny local models (built once into the user cache, deterministic).

Every server and engine a test starts inherits `ADASPEC_STRICT=1`: a plugin fallback raises
there (`adapters/speculative/fallbacks.py`), so a test that meets one fails. A test that means
to exercise a fallback sets `ADASPEC_STRICT=0` for its server and asserts the counter."""

from __future__ import annotations

import os

import pytest

from sgl_adaspec.adapters.speculative.fallbacks import STRICT_ENV
from sgl_adaspec.models.tiny import TinyModels, ensure_models

os.environ[STRICT_ENV] = "1"


@pytest.fixture(scope="session")
def models() -> TinyModels:
    return ensure_models()


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` run only where torch sees a CUDA device (`make gpu-check`)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (make gpu-check)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def prometheus_sink():
    """The plugin's Prometheus sink with a class `chat`, on prometheus_client's default registry
    (which holds one: a second would register its series twice)."""
    from sgl_adaspec.speculative.metrics import PrometheusSink

    return PrometheusSink(slo_classes=("chat",))
