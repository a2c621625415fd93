"""SLO-aware adaptive speculative decoding for SGLang."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("sgl_adaspec")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"


def __getattr__(name: str):
    # `sgl_adaspec.Engine` loads SGLang only when asked for: the package itself stays light.
    if name == "Engine":
        from sgl_adaspec.adapters.sglang_engine import Engine

        return Engine
    raise AttributeError(f"module 'sgl_adaspec' has no attribute {name!r}")
