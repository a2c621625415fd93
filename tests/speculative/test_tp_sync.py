"""Rank 0 decides under tensor parallelism (`adapters/speculative/tp_sync.py`): what each rank
sends and takes, on a fake two-rank group (the real group runs in
tests/e2e/test_tensor_parallel_e2e.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sgl_adaspec.adapters.scheduler import bound_prefill, order_waiting_queue
from sgl_adaspec.adapters.speculative import runtime as plugin_runtime
from sgl_adaspec.adapters.speculative.tp_sync import CLOCK_RATES_ENV, TpSync, clock_rate
from sgl_adaspec.config import AdaspecConfig


class FakeGroup:
    """Two ranks; rank 0's broadcasts are recorded, rank 1 receives `from_rank_0`."""

    world_size = 2

    def __init__(self, rank: int, from_rank_0=None):
        self.rank_in_group = rank
        self.from_rank_0 = from_rank_0
        self.sent = []

    def broadcast_object(self, obj, src=0):
        assert src == 0
        if self.rank_in_group == 0:
            self.sent.append(obj)
            return obj
        assert obj is None
        return self.from_rank_0

    def broadcast(self, tensor, src=0):
        assert src == 0 and tensor.dtype == torch.uint8
        if self.rank_in_group == 0:
            self.sent.append(tensor.clone())
        else:
            tensor.copy_(self.from_rank_0)
        return tensor


def test_one_rank_broadcasts_nothing():
    sync = TpSync()
    assert sync.leads and sync.size == 1
    mask = torch.tensor([[True, False]])
    assert sync.value((3, 2)) == (3, 2) and sync.mask(mask, (1, 2), "cpu") is mask


def test_rank_0_sends_its_decisions_and_rank_1_takes_them():
    leader = TpSync(FakeGroup(0))
    mask = torch.tensor([[True, False, True], [True, True, False]])
    assert leader.value((2, 4)) == (2, 4)
    assert torch.equal(leader.mask(mask, (2, 3), "cpu"), mask)
    assert leader.group.sent[0] == (2, 4) and torch.equal(leader.group.sent[1], mask.byte())

    follower = TpSync(FakeGroup(1, from_rank_0=(0, 1)))
    assert not follower.leads and follower.value(None) == (0, 1)
    follower.group.from_rank_0 = mask.byte()
    assert torch.equal(follower.mask(None, (2, 3), "cpu"), mask)


def test_test_clock_rates_apply_per_rank(monkeypatch):
    monkeypatch.setenv(CLOCK_RATES_ENV, "1,5")
    assert clock_rate(TpSync(FakeGroup(0))) == 1.0
    assert clock_rate(TpSync(FakeGroup(1))) == 5.0
    monkeypatch.delenv(CLOCK_RATES_ENV)
    assert clock_rate(TpSync(FakeGroup(1))) == 1.0


@pytest.fixture
def follower_runtime(monkeypatch):
    """An adaserve scheduler on rank 1 of 2 (SLO-aware admission on)."""
    config = AdaspecConfig(spec_policy="adaserve")
    monkeypatch.setenv("ADASPEC_CONFIG", config.to_json())
    group = FakeGroup(1)
    sync = TpSync(group)
    monkeypatch.setattr(plugin_runtime, "_RUNTIME", plugin_runtime.Runtime(config, tp_sync=sync))
    return group


def test_a_follower_admits_in_rank_0s_order(follower_runtime):
    queue = ["a", "b", "c"]  # a follower reads nothing of the requests
    follower_runtime.from_rank_0 = [2, 0, 1]
    order_waiting_queue(None, None, queue)
    assert queue == ["c", "a", "b"]


def test_a_follower_takes_rank_0s_prefill_limit(follower_runtime):
    # No running request on this rank would cap anything; rank 0's 100 tokens apply.
    group = follower_runtime
    group.from_rank_0 = 100
    args, _ = bound_prefill("adder", 1, "tree", "alloc", SimpleNamespace(reqs=[]), 0.5, 16384, 4096)
    assert args[6] == 100 and args[7] == 100
    group.from_rank_0 = None  # rank 0 leaves SGLang's limits alone
    assert (
        bound_prefill("adder", 1, "tree", "alloc", SimpleNamespace(reqs=[]), 0.5, 16384, 4096)
        is None
    )
