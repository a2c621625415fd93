"""Device results on their way to the host without waiting for them: an iteration's outcome is
copied as the iteration ends and read one iteration later (`IterationDriver.observe_lag`),
when the device has long finished it, so no read waits on work queued after it.

On a GPU a copy goes to pinned host memory with `non_blocking=True`, and an event recorded
after the copies says when they landed, as SGLang's overlap scheduler reads its own results
(`copy_done`). On CPU the copy is a clone: the iteration's buffers are reused by the next.
`to_device` and `to_dtype` are the moves the decision makes between the draft and the verify:
none (not even a call) where the tensor already is what is asked.
"""

from __future__ import annotations

import torch


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """A host tensor that holds `tensor` once `copies_landed` of its device reports so."""
    tensor = tensor.detach()
    if tensor.device.type == "cpu":
        return tensor.clone()
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    return host.copy_(tensor, non_blocking=True)


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` on `device`: itself where it is (no call between the draft and the verify),
    else a copy that does not wait on the device."""
    return tensor if tensor.device == device else tensor.to(device, non_blocking=True)


def to_dtype(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`tensor` as `dtype`: itself where it already is (no call), else a cast."""
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


def copies_landed(device: torch.device | None):
    """An event recorded after the copies started so far on `device`'s stream (None on CPU,
    where they already landed): wait on it with `wait_for`."""
    if device is None or device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record()
    return event


def wait_for(event) -> None:
    if event is not None:
        event.synchronize()
