"""`sglang.Engine` (SGLang's in-process API) with the plugin's flags as keyword arguments.

    from sgl_adaspec import Engine
    engine = Engine(model_path=M, speculative_algorithm="EAGLE", speculative_draft_model_path=D,
                    spec_policy="adaserve", slo_config="classes.yaml")
    engine.generate(prompt, {"max_new_tokens": 64, "custom_params": {"tpot_slo_ms": 40}})

`sglang.Engine` builds its `ServerArgs` from its keyword arguments, which know no plugin flag
(`spec_policy=` is a TypeError there), so a policy could not be chosen in-process. Each plugin
flag is the keyword of its command-line destination (`--spec-policy` -> `spec_policy`,
`--tetris-extra` -> `tetris_extra`); they are checked as the launcher checks them (ConfigError,
a ValueError, naming the problem) and published to the processes the engine starts.

The plugin's config is one per process, as a launcher's is: an environment variable that the
engine's processes inherit and that request validation in this process reads, so the last
engine's holds. With `server_args=` and no plugin keyword, the config published when those
server args were parsed (`prepare_server_args`) stands.
"""

from __future__ import annotations

from types import SimpleNamespace

from sglang.srt.entrypoints.engine import Engine as SglangEngine

from sgl_adaspec.adapters import cli
from sgl_adaspec.config import AdaspecConfig


class Engine(SglangEngine):
    def __init__(self, **kwargs) -> None:
        names = cli.flag_names()
        plugin = {key: kwargs.pop(key) for key in list(kwargs) if key in names}
        server_args = kwargs.get("server_args")
        if plugin or server_args is None:
            config = AdaspecConfig.from_mapping(plugin)
            # SGLang's flags as given, unresolved, as the launcher's check sees them.
            cli.adopt(config, server_args or SimpleNamespace(**kwargs))
        super().__init__(**kwargs)
