"""Routes SGLang's CUDA/Triton-only speculative paths to the pure-torch versions on CPU.

Every hook decides per call from the tensors' (or the model runner's) device, so on CUDA it
falls through to SGLang's own implementation. SGLang's CPU *engine* (`SGLANG_USE_CPU_ENGINE=1`,
sgl-kernel CPU ops) keeps its own path too: these hooks only fill the generic `--device cpu` path.
"""

from __future__ import annotations

import contextlib
import sys
import types
from typing import Any, Callable

import torch


def on_generic_cpu(device: Any) -> bool:
    """True on `--device cpu` without SGLang's sgl-kernel CPU engine."""
    from sglang.srt.utils import is_cpu as cpu_engine_enabled

    return torch.device(device).type == "cpu" and not cpu_engine_enabled()


@contextlib.contextmanager
def _rope_fallback_placeholder():
    """RotaryEmbedding.__init__ imports `vllm._custom_ops.rotary_embedding` on devices it does
    not know, although its CPU forward is `forward_native`. Make that import resolve to a
    placeholder for the duration of the constructor only, if vllm is absent."""
    if "vllm" in sys.modules or _importable("vllm"):
        yield
        return
    vllm = types.ModuleType("vllm")
    ops = types.ModuleType("vllm._custom_ops")

    def rotary_embedding(*args, **kwargs):
        raise RuntimeError("the vllm rotary kernel is not available on CPU")

    ops.rotary_embedding = rotary_embedding
    vllm._custom_ops = ops
    sys.modules.update({"vllm": vllm, "vllm._custom_ops": ops})
    try:
        yield
    finally:
        sys.modules.pop("vllm._custom_ops", None)
        sys.modules.pop("vllm", None)


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def rope_init(original: Callable, self, *args, **kwargs):
    """AROUND hook on `RotaryEmbedding.__init__`."""
    with _rope_fallback_placeholder():
        return original(self, *args, **kwargs)


def register(registry, hook_type) -> None:
    registry.register(
        "sglang.srt.layers.rotary_embedding.base.RotaryEmbedding.__init__",
        rope_init,
        hook_type.AROUND,
    )
