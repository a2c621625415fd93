"""Shared fixtures: the tiny local models (built once into the user cache, deterministic)."""

from __future__ import annotations

import pytest

from sgl_adaspec.models.tiny import TinyModels, ensure_models


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
