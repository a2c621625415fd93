"""Entry point of the `sglang.srt.plugins` group: SGLang calls `register()` in every process.

It registers hooks only; SGLang applies them after all plugins ran. What each hook does lives in
its own module: flags in `cli`, the CPU enablement in `platform.cpu`.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sgl_adaspec import cli
    from sgl_adaspec.platform.cpu import hooks as cpu_hooks
    from sgl_adaspec.scheduler import dp_adapter
    from sgl_adaspec.scheduler import sglang_adapter as scheduler_adapter
    from sgl_adaspec.speculative.sglang import hooks as spec_hooks

    server_args = "sglang.srt.server_args.ServerArgs"
    HookRegistry.register(f"{server_args}.add_cli_args", cli.add_cli_args, HookType.AFTER)
    HookRegistry.register(f"{server_args}.from_cli_args", cli.from_cli_args, HookType.AROUND)
    HookRegistry.register(
        "sglang.srt.sampling.sampling_params.SamplingParams.verify",
        _validate_request_slo,
        HookType.AFTER,
    )
    cpu_hooks.register(HookRegistry, HookType)
    spec_hooks.register(HookRegistry, HookType)
    scheduler_adapter.register(HookRegistry, HookType)
    dp_adapter.register(HookRegistry, HookType)


def _validate_request_slo(_result, sampling_params, *args, **kwargs) -> None:
    """AFTER hook on `SamplingParams.verify`: SGLang turns its ValueError into HTTP 400."""
    from sgl_adaspec.config import AdaspecConfig
    from sgl_adaspec.scheduler.request_slo import parse_request_slo

    parse_request_slo(sampling_params.custom_params, AdaspecConfig.from_env().load_slo_config())
