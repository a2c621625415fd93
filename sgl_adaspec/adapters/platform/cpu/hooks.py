"""Routes SGLang's CUDA/Triton-only speculative paths to the pure-torch versions on CPU.

Every hook decides per call from the tensors' (or the model runner's) device, so on CUDA it
falls through to SGLang's own implementation. SGLang's CPU *engine* (`SGLANG_USE_CPU_ENGINE=1`,
sgl-kernel CPU ops) keeps its own path too: these hooks only fill the generic `--device cpu` path.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import types
from collections.abc import Callable
from typing import Any

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


def _first_tensor(args, kwargs) -> torch.Tensor:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
    raise TypeError("no tensor argument to tell the device from")


def route_on_cpu(torch_impl: Callable) -> Callable:
    """An AROUND hook running `torch_impl` (same signature) when the call's tensors are on the
    generic CPU device, and SGLang's original otherwise."""

    def hook(original, *args, **kwargs):
        if on_generic_cpu(_first_tensor(args, kwargs).device):
            return torch_impl(*args, **kwargs)
        return original(*args, **kwargs)

    hook.__qualname__ = f"route_on_cpu({torch_impl.__name__})"
    return hook


def eager_on_cpu(original: Callable, *args, **kwargs):
    """AROUND hook on a function SGLang compiles with torch.compile: on the generic CPU, the
    function itself, uncompiled. SGLang compiles the draft's beam step (dynamic shapes); on
    this project's CPU a compile takes 3-8 s (one per server process, at its warm-up request;
    more where a new shape breaks a guard: a lone call with a batch of one, then of four, then
    width one, compiled three times), and it needs a C++ compiler and Python's headers at run
    time (an image without them failed its first request). Eager is as fast per call here
    (~0.1 ms)."""
    if on_generic_cpu(_first_tensor(args, kwargs).device):
        return getattr(original, "_torchdynamo_orig_callable", original)(*args, **kwargs)
    return original(*args, **kwargs)


def _verify_tree_greedy(*args, topk: int = -1, **kwargs):
    from sgl_adaspec.adapters.platform.cpu.tree_verify import verify_tree_greedy

    verify_tree_greedy(*args, **kwargs)
    names = ("predicts", "accept_index", "accept_token_num")
    bound = dict(zip(names, args)) | {k: kwargs[k] for k in names if k in kwargs}
    return bound["predicts"], bound["accept_index"], bound["accept_token_num"]


def keep_overlap_schedule(original: Callable, server_args) -> None:
    """AROUND hook on SGLang's `_disable_overlap_schedule_for_cpu`: a speculative server on the
    generic CPU keeps SGLang's overlap schedule, as on CUDA, so the CPU serves through the
    scheduler path GPUs run (its one Triton kernel, `gather_spec_extras`, routed to torch);
    `--disable-overlap-schedule` still turns it off."""
    from sglang.srt.arg_groups.overrides import resolving_view

    if resolving_view(server_args).device == "cpu" and on_generic_cpu("cpu"):
        return
    original(server_args)


def kv_copy_init(original: Callable, pool) -> None:
    """AROUND hook on `MHATokenToKVPool._init_kv_copy_and_warmup`: the tiled KV copy is a Triton
    kernel over raw pointers; on CPU use SGLang's own torch move (`move_kv_cache_native`)."""
    if not on_generic_cpu(pool.device):
        return original(pool)
    pool.use_native_move_kv_cache = True
    pool._kv_copy_config = None


def torch_native_backend_factory(original: Callable) -> Callable:
    """Wraps SGLang's `torch_native` attention factory: on CPU, the tree-aware subclass."""

    def create(runner):
        if on_generic_cpu(runner.device):
            from sgl_adaspec.adapters.platform.cpu.attention import TorchTreeAttnBackend

            return TorchTreeAttnBackend(runner)
        return original(runner)

    create.__wrapped__ = original
    return create


def _draft_backend_is_torch_native(factory, backend_name: str) -> bool:
    from sglang.srt.runtime_context import attention_backends

    prefill_backend, decode_backend = attention_backends()
    configured = decode_backend if backend_name == "decode" else prefill_backend
    chosen = factory.draft_attn_backend or configured
    return chosen == "torch_native" and on_generic_cpu(factory.draft_model_runner.device)


def create_draft_decode_backend(original: Callable, factory):
    """AROUND hook on `DraftBackendFactory.create_decode_backend`."""
    if factory.speculative_num_steps <= 1 or not _draft_backend_is_torch_native(factory, "decode"):
        return original(factory)
    from sgl_adaspec.adapters.platform.cpu.attention import TorchMultiStepDraftBackend

    return TorchMultiStepDraftBackend(
        factory.draft_model_runner, factory.topk, factory.speculative_num_steps
    )


def create_draft_extend_backend(original: Callable, factory):
    """AROUND hook on `DraftBackendFactory.create_draft_extend_backend`."""
    from sglang.srt.runtime_context import get_spec

    which = "decode" if get_spec().speculative_attention_mode == "decode" else "prefill"
    if not _draft_backend_is_torch_native(factory, which):
        return original(factory)
    from sgl_adaspec.adapters.platform.cpu.attention import TorchTreeAttnBackend

    return TorchTreeAttnBackend(factory.draft_model_runner)


def setup() -> None:
    """What the CPU path needs besides its hooks (`hook_table`): the torch_native attention
    factory and the kernels SGLang leaves as None on CPU."""
    from sgl_adaspec.adapters.platform.cpu.renorm import top_k_renorm_prob, top_p_renorm_prob
    from sgl_adaspec.adapters.platform.cpu.tree_verify import tree_speculative_sampling_target_only

    _register_attention_factory()
    for kernel in (tree_speculative_sampling_target_only, top_k_renorm_prob, top_p_renorm_prob):
        _provide_missing_kernel("sglang.srt.speculative.eagle_utils", kernel.__name__, kernel)


def _routed(module: str, name: str) -> Callable:
    """`route_on_cpu` of `<module>.<name>` in this package, importing the module on first use
    (it imports SGLang's kernels)."""

    def hook(original, *args, **kwargs):
        kernels = importlib.import_module(f"sgl_adaspec.adapters.platform.cpu.{module}")
        if on_generic_cpu(_first_tensor(args, kwargs).device):
            return getattr(kernels, name)(*args, **kwargs)
        return original(*args, **kwargs)

    hook.__qualname__ = f"route_on_cpu({name})"
    return hook


build_tree_on_cpu = _routed("tree_build", "build_tree_kernel_efficient")
assign_draft_cache_locs_on_cpu = _routed("cache_slots", "assign_draft_cache_locs_contiguous")
assign_extend_cache_locs_on_cpu = _routed("cache_slots", "assign_extend_cache_locs")
fill_front_out_cache_loc_on_cpu = _routed("cache_slots", "fill_front_out_cache_loc")
fill_bonus_tokens_on_cpu = _routed("cache_slots", "fill_bonus_tokens")
fill_accept_out_cache_loc_on_cpu = _routed("cache_slots", "fill_accept_out_cache_loc")
assign_req_to_token_pool_on_cpu = _routed("cache_slots", "assign_req_to_token_pool")
gather_spec_extras_on_cpu = _routed("cache_slots", "gather_spec_extras")
verify_tree_greedy_on_cpu = route_on_cpu(_verify_tree_greedy)


def _provide_missing_kernel(module_name: str, name: str, torch_impl: Callable) -> None:
    """Fill a kernel SGLang leaves as None where it has no implementation (its CPU sampling
    verify). The hook registry cannot wrap a None (it would rebind every None it finds), and
    there is nothing to route around: the name is set only while it is None."""
    module = importlib.import_module(module_name)
    if getattr(module, name) is None:
        setattr(module, name, torch_impl)


def _register_attention_factory() -> None:
    """Route `--attention-backend torch_native` through SGLang's own backend registry (a dict
    of factories, which the hook registry's attribute patching does not reach)."""
    from sglang.srt.layers.attention import attention_registry

    current = attention_registry.ATTENTION_BACKENDS["torch_native"]
    if getattr(current, "__wrapped__", None) is None:
        attention_registry.register_attention_backend("torch_native")(
            torch_native_backend_factory(current)
        )
