"""A placeholder `torchvision` for the slim CPU install, where the real one cannot be installed.

PyPI's torchvision either swaps in a CUDA torch or fails to import beside the CPU build, yet
SGLang imports `torchvision.transforms` at module level on paths a text-only server reaches
(multimodal utils pulled in by model configs). Those paths never call into it for text models.
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

_NAMES = ("torchvision", "torchvision.transforms", "torchvision.transforms.functional")


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
        if fullname not in _NAMES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _PlaceholderModule(spec.name)
        module.__path__ = []
        if spec.name == "torchvision.transforms.functional":
            module.InterpolationMode = InterpolationMode
        return module

    def exec_module(self, module) -> None:
        pass


def install() -> None:
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    # Placed last: a real torchvision, when present, is found by the normal finders first.
    sys.meta_path.append(_Finder())
