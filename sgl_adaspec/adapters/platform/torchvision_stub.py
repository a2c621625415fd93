"""A placeholder `torchvision` for the slim CPU install, where the real one cannot be installed.

PyPI's torchvision either swaps in a CUDA torch or fails to import beside the CPU build, yet
SGLang imports `torchvision.transforms` at module level on paths a text-only server reaches
(multimodal utils pulled in by model configs). Those paths never call into it for text models.
Only imports made by SGLang's own modules get the placeholder; everyone else still sees no
torchvision.
A `.pth` file written by `scripts/setup_venv.sh` calls `install()` at interpreter start, because
SGLang's spawned children import those modules before any plugin loads. When a real torchvision
is installed, `install()` does nothing. Any use of the placeholder raises a clear error.
"""

from __future__ import annotations

import enum
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

_ROOT = "torchvision"


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"


class _Unavailable:
    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(
            f"{self._name} is a placeholder: torchvision is not installed in this CPU "
            "environment (image inputs are not supported here)"
        )


class _PlaceholderModule(types.ModuleType):
    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Unavailable(f"{self.__name__}.{attr}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != _ROOT and not fullname.startswith(_ROOT + "."):
            return None
        if not _asked_by_sglang():
            # Availability probes (transformers' `find_spec("torchvision")`) must keep seeing
            # no torchvision, or they enable torchvision-backed image processing.
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _PlaceholderModule(spec.name)
        module.__path__ = []
        module.InterpolationMode = InterpolationMode
        return module

    def exec_module(self, module) -> None:
        pass


def _asked_by_sglang() -> bool:
    """Whether the innermost caller outside the import machinery is a module of SGLang."""
    frame = sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if not module.startswith(("importlib", "_frozen_importlib", __name__)):
            return module == "sglang" or module.startswith("sglang.")
        frame = frame.f_back
    return False


def install() -> None:
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    # Placed last: a real torchvision, when present, is found by the normal finders first.
    sys.meta_path.append(_Finder())
