"""SLO-aware adaptive speculative decoding for SGLang."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("sgl_adaspec")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
