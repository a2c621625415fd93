"""Entry point of the `sglang.srt.plugins` group: SGLang calls `register()` in every process.

It registers hooks only; SGLang applies them after all plugins ran. What each hook does lives in
its own module: flags in `cli`, the CPU enablement in `platform.cpu`.
"""

from __future__ import annotations

import logging
import operator

logger = logging.getLogger(__name__)


# The SGLang release whose functions the hook table names.
SUPPORTED_SGLANG = "0.5.23"


def check_sglang_version(found: str | None = None) -> None:
    """Refuse (a RuntimeError SGLang logs, leaving the plugin out) any SGLang but the one the
    hooks were written against: they wrap that release's functions by name."""
    from importlib.metadata import version

    from sgl_adaspec import __version__

    found = found if found is not None else version("sglang")
    if found != SUPPORTED_SGLANG:
        raise RuntimeError(
            f"sgl_adaspec {__version__} hooks SGLang {SUPPORTED_SGLANG}; this environment has "
            f"sglang {found}. Install sglang=={SUPPORTED_SGLANG}, or load SGLang without this "
            "plugin: SGLANG_PLUGINS=<the plugins to load> (sgl_adaspec not among them)"
        )


def register() -> None:
    check_sglang_version()
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sgl_adaspec.adapters import hook_table
    from sgl_adaspec.adapters.platform.cpu import hooks as cpu_hooks
    from sgl_adaspec.adapters.platform.cpu import interpreter_baseline

    # The Triton-interpreter baseline runs SGLang's own kernels on CPU: no CPU-path hooks.
    cpu_path = not interpreter_baseline.requested()
    if not cpu_path:
        interpreter_baseline.enable()
    hook_table.register(HookRegistry, HookType, cpu_path)
    if cpu_path:
        cpu_hooks.setup()


def _validate_request_slo(_result, sampling_params, *args, **kwargs) -> None:
    """AFTER hook on `SamplingParams.verify`: SGLang turns its ValueError into HTTP 400."""
    from sgl_adaspec.config import AdaspecConfig
    from sgl_adaspec.scheduler.request_slo import parse_request_slo

    parse_request_slo(sampling_params.custom_params, AdaspecConfig.from_env().load_slo_config())


def _check_prompt_ids(_result, manager, obj, input_ids, *args, **kwargs) -> None:
    """AFTER hook on `TokenizerManager._validate_one_request`: a prompt of no tokens (text that
    tokenizes to nothing, on a tokenizer without a BOS token) and a token id outside the target's
    vocabulary are refused as the request's error (HTTP 400). SGLang 0.5.23 checks lengths there
    but neither of these, and both reach the model's forward and take the scheduler down.
    Requests with embeddings or multimodal data are left to SGLang: their ids may hold a
    processor's placeholders."""
    fields = ("input_embeds", "image_data", "video_data", "audio_data")
    if input_ids is None or any(getattr(obj, name, None) is not None for name in fields):
        return
    if len(input_ids) == 0:
        raise ValueError("the prompt is empty: it has no tokens to prefill")
    vocab_size = manager.model_config.vocab_size
    for token in input_ids:
        try:  # numpy's and torch's integers too (sglang.Engine callers)
            in_vocabulary = 0 <= operator.index(token) < vocab_size
        except TypeError:
            in_vocabulary = False
        if not in_vocabulary:
            raise ValueError(
                f"input_ids contains {token!r}, not a token id of the model's vocabulary "
                f"[0, {vocab_size})"
            )


async def _slo_from_openai_metadata(original, serving, request, raw_request, *args, **kwargs):
    """AROUND `OpenAIServingBase.handle_request`: a request without `custom_params` takes its
    SLO fields from OpenAI's `metadata` object, which SGLang's request models do not declare
    (so it is read from the body FastAPI already parsed and cached), or else from its SLO
    headers (`request_slo.ALL_SLO_HEADERS`; a bad value: HTTP 400 naming the header)."""
    from sgl_adaspec.adapters.fleet_view import note_routing_key
    from sgl_adaspec.scheduler.request_slo import slo_params_of_metadata, with_header_slo

    if raw_request is not None:
        note_routing_key(raw_request.headers)
    if hasattr(request, "custom_params") and request.custom_params is None and raw_request:
        try:
            body = await raw_request.json()
        except ValueError:
            body = None
        if isinstance(body, dict):
            request.custom_params = slo_params_of_metadata(body.get("metadata"))
    if hasattr(request, "custom_params") and raw_request is not None:
        header_params = _header_slo(raw_request)
        request.custom_params = with_header_slo(request.custom_params, header_params)
    return await original(serving, request, raw_request, *args, **kwargs)


async def _slo_from_generate_headers(original, obj, request, *args, **kwargs):
    """AROUND `http_server.serve_generate_request`: /generate takes SLO headers too, into each
    prompt's `custom_params` that states no SLO of its own (behind sglang-router, which drops
    `custom_params` there, the `x-request-id-slo-*` ones are its only SLO)."""
    from sgl_adaspec.adapters.fleet_view import note_routing_key
    from sgl_adaspec.scheduler.request_slo import with_header_slo

    if request is not None:
        note_routing_key(request.headers)
    header_params = _header_slo(request) if request is not None else None
    if header_params is not None:
        params = obj.sampling_params
        if isinstance(params, list):
            for one in params:
                one["custom_params"] = with_header_slo(one.get("custom_params"), header_params)
        else:
            params = params if params is not None else {}
            params["custom_params"] = with_header_slo(params.get("custom_params"), header_params)
            obj.sampling_params = params
    return await original(obj, request, *args, **kwargs)


def _header_slo(raw_request) -> dict | None:
    """The request's SLO headers as `custom_params`; an HTTP 400 naming a bad one."""
    from fastapi import HTTPException

    from sgl_adaspec.config import AdaspecConfig
    from sgl_adaspec.scheduler.request_slo import slo_params_of_headers

    try:
        return slo_params_of_headers(
            raw_request.headers, AdaspecConfig.from_env().load_slo_config()
        )
    except ValueError as exc:
        raise HTTPException(status_code=400, detail=str(exc)) from exc
