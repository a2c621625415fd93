"""`one_node_verify`: a plain iteration's verify runs as a chain's on a CPU only."""

from types import SimpleNamespace

import pytest

from sgl_adaspec.adapters.speculative.plain_decode import one_node_verify


def test_one_node_verify_runs_as_a_chain_and_restores_the_tree_width():
    worker = SimpleNamespace(device="cpu", topk=4)
    with one_node_verify(worker):
        assert worker.topk == 1  # run_eagle_verify then skips the tree compaction
    assert worker.topk == 4
    with pytest.raises(RuntimeError), one_node_verify(worker):
        raise RuntimeError("verify failed")
    assert worker.topk == 4


def test_one_node_verify_leaves_cuda_workers_alone():
    worker = SimpleNamespace(device="cuda", topk=4)
    with one_node_verify(worker):
        assert worker.topk == 4  # topk 1 would switch SGLang to its fused chain commit
