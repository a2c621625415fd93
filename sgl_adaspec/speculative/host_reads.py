"""Host reads of device tensors, counted: each one is a device synchronisation on a GPU.

Between the draft and the verify the server must not wait on the device (the verify's launch
would wait for it, and SGLang's overlap scheduler with it). On CPU nothing is a device, so the
tensors a GPU would hold are marked instead: `on_device(t)` returns `t` as a `DeviceResident`
view, torch operations propagate the mark to their results, and `HostReadCounter` counts every
operation that hands a marked tensor's values to Python (`.item()`, `.tolist()`, `bool()`,
`int()`, `.cpu()`, ...) or whose output shape depends on its values (`nonzero`, a boolean
index), as those synchronise on CUDA, and every blocking copy of host data to a device
(`to_device`), which waits for the device's stream too. Tensors built from host data (SLO
state, counts) are not marked: reading them costs the GPU nothing.
"""

from __future__ import annotations

import traceback
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

Tensor = torch.Tensor

# Functions that read a tensor's values on the host, or size their output by those values.
_READS = {
    Tensor.item: "item", Tensor.tolist: "tolist", Tensor.__bool__: "bool",
    Tensor.__int__: "int", Tensor.__float__: "float", Tensor.__index__: "index",
    Tensor.numpy: "numpy", Tensor.cpu: "cpu", torch.equal: "equal",
    Tensor.equal: "equal", Tensor.nonzero: "nonzero", torch.nonzero: "nonzero",
    torch.masked_select: "masked_select", Tensor.masked_select: "masked_select",
    torch.unique: "unique", Tensor.unique: "unique",
}  # fmt: skip


class DeviceResident(Tensor):
    """A tensor that would live on the GPU (see the module docstring): operations on it give
    device-resident results, but for its copies to the host (`.cpu()`, `.to("cpu")`)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        result = super().__torch_function__(func, types, args, kwargs or {})
        if func is Tensor.cpu or (func is Tensor.to and _to_host(args[1:], kwargs or {})):
            return result.as_subclass(Tensor)
        return result


def on_device(tensor: Tensor | None) -> Tensor | None:
    """`tensor` marked as device-resident (a view, no copy)."""
    if tensor is None or isinstance(tensor, DeviceResident):
        return tensor
    return tensor.as_subclass(DeviceResident)


def unmarked(tensor: Tensor | None) -> Tensor | None:
    """`tensor` as a plain tensor again (a view)."""
    return tensor if tensor is None else tensor.as_subclass(Tensor)


def _marked(values) -> bool:
    for value in values:
        if isinstance(value, DeviceResident):
            return True
        if isinstance(value, (tuple, list)) and _marked(value):
            return True
    return False


class HostReadCounter(TorchFunctionMode):
    """Counts host reads of device-resident tensors while active: `count`, `by_kind`
    {name: count} and `sites` {"file:line": count} of the first frame outside torch."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.by_kind: Counter[str] = Counter()
        self.sites: Counter[str] = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = self._read_kind(func, args, kwargs)
        if kind is not None:
            self.count += 1
            self.by_kind[kind] += 1
            self.sites[_caller()] += 1
        return func(*args, **kwargs)

    @staticmethod
    def _read_kind(func, args, kwargs) -> str | None:
        if _host_to_device(func, args, kwargs):
            return "to_device"
        if not _marked(args) and not _marked(kwargs.values()):
            return None
        if func in _READS:
            return _READS[func]
        if func is Tensor.to and _to_host(args[1:], kwargs) and not kwargs.get("non_blocking"):
            return "to_cpu"  # a non-blocking copy does not wait for the device
        if func is Tensor.__getitem__ and _bool_index(args[1]):
            return "bool_index"
        return None


def _host_to_device(func, args, kwargs) -> bool:
    """A blocking copy of host data to a device: `torch.tensor` / `torch.as_tensor` of host
    values placed on a device, or `.to(device)` of an unmarked tensor without `non_blocking`
    (on CUDA these wait for the stream, the draft's kernels with it). On CPU, where the
    device is the host, any explicit placement counts: inside the window it means the draft's
    device. Factories that fill on the device (`full`, `arange`, `zeros`) copy nothing."""
    if func in (torch.tensor, torch.as_tensor):
        return kwargs.get("device") is not None and not _marked(args[:1])
    if func is Tensor.to and not _marked(args[:1]) and not kwargs.get("non_blocking"):
        target = kwargs.get("device", args[1] if len(args) > 1 else None)
        return isinstance(target, (str, torch.device, Tensor)) and not isinstance(target, bool)
    return False


def _to_host(args, kwargs) -> bool:
    target = kwargs.get("device", args[0] if args else None)
    if isinstance(target, Tensor):
        target = target.device
    return target is not None and not isinstance(target, torch.dtype) and (
        torch.device(target).type == "cpu"
    )


def _bool_index(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(item, Tensor) and item.dtype == torch.bool for item in items)


def _caller() -> str:
    for frame in reversed(traceback.extract_stack()[:-2]):
        if "/torch/" not in frame.filename and frame.filename != __file__:
            return f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"
    return "?"


def free_to_read(tensor: Tensor) -> bool:
    """Whether reading `tensor` on the host costs no device synchronisation: it lives in host
    memory and is not marked device-resident. Shortcuts that read a tensor to skip work are
    taken only then; on a device the work is done instead."""
    return tensor.device.type == "cpu" and not isinstance(tensor, DeviceResident)
