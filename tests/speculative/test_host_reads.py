"""The host-read counter: what synchronises on a GPU is counted, device work is not."""

from __future__ import annotations

import torch

from sgl_adaspec.speculative.host_reads import HostReadCounter, on_device, unmarked


def test_device_work_is_not_a_read_and_the_mark_propagates():
    f = on_device(torch.rand(4, 8))
    host = torch.arange(4, dtype=torch.float32)  # host data: reading it costs no sync
    with HostReadCounter() as counter:
        ranked = torch.sort(f, dim=1, descending=True).values
        mask = (ranked.cumsum(1) < host[:, None]) & (f > 0.1)
        picked = torch.where(mask, f, 0.0).sum(dim=1)
        _ = int(host.sum())
    assert counter.count == 0, counter.sites
    assert type(picked).__name__ == "DeviceResident"


def test_every_kind_of_host_read_is_counted():
    f = on_device(torch.rand(3, 5))
    with HostReadCounter() as counter:
        f.sum().item()
        f.tolist()
        bool(f.any())
        int(f.argmax())
        float(f.max())
        f.cpu()
        f.to("cpu")
        torch.equal(f, f)
        f.nonzero()
        f[f > 0.5]
    assert counter.count == 10, counter.by_kind
    assert set(counter.by_kind) == {
        "item", "tolist", "bool", "int", "float", "cpu", "to_cpu", "equal", "nonzero",
        "bool_index",
    }  # fmt: skip
    assert all(site.startswith("test_host_reads.py:") for site in counter.sites), counter.sites


def test_unmarked_tensors_are_plain_again():
    f = unmarked(on_device(torch.ones(2)))
    with HostReadCounter() as counter:
        f.tolist()
    assert counter.count == 0 and type(f) is torch.Tensor


def test_copies_to_the_host_are_host_tensors_and_non_blocking_copies_are_no_reads():
    f = on_device(torch.rand(3))
    with HostReadCounter() as counter:
        moved = f.to("cpu", non_blocking=True)
        copied = f.cpu()
    assert counter.count == 1 and dict(counter.by_kind) == {"cpu": 1}
    assert type(moved) is torch.Tensor and type(copied) is torch.Tensor


def test_a_blocking_copy_of_host_data_to_the_device_is_counted():
    f = on_device(torch.rand(3))
    host = torch.ones(3)
    with HostReadCounter() as counter:
        torch.tensor([1, 2], device=f.device)
        torch.as_tensor(2, device=f.device)
        host.to(f.device)
        host.to(f.device, non_blocking=True)  # not counted: the host does not wait
        torch.full((), 2, device=f.device)  # filled on the device: nothing copied
        torch.arange(3, device=f.device)
        f.to(torch.float64)  # a dtype, on the device
    assert counter.count == 3 and dict(counter.by_kind) == {"to_device": 3}, counter.sites
