"""The CPU tree-attention backend's verify: the one-node verify
(`TorchTreeAttnBackend._forward_one_token`) attends each request to its prefix and its verify
slot, wherever SGLang put that slot; the ragged verify reads the kept nodes off the forward
batch's verify input (`ragged_verify`) and attends as the whole tree's verify does for them. The
end-to-end tests check both against real SGLang (greedy outputs identical to no speculation);
these check them on hand-built KV pools."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang.srt.speculative.eagle_info import EagleVerifyInput
from torch.nn.functional import scaled_dot_product_attention

from sgl_adaspec.adapters.platform.cpu.attention import TorchTreeAttnBackend
from sgl_adaspec.adapters.platform.cpu.ragged_verify import RaggedVerifyInput, ragged_verify

HEADS, DIM, SLOTS = 2, 4, 32


class Batch(SimpleNamespace):
    """A forward batch's fields the backend reads (weakly referable, as SGLang's is)."""


def backend(req_to_token: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor):
    """The backend's state the one-node verify reads, without a model runner."""
    fake = SimpleNamespace(
        req_to_token_pool=SimpleNamespace(req_to_token=req_to_token),
        token_to_kv_pool=SimpleNamespace(
            get_key_buffer=lambda layer_id: k_cache, get_value_buffer=lambda layer_id: v_cache
        ),
    )
    fake._slots_in_row = None
    fake._slots_follow_prefix = lambda batch: TorchTreeAttnBackend._slots_follow_prefix(fake, batch)
    fake._tree_masks = lambda *a: TorchTreeAttnBackend._tree_masks(fake, *a)
    fake._kv = lambda layer, slots: TorchTreeAttnBackend._kv(fake, layer, slots)
    return fake


def one_token_attention(req_to_token, out_cache_loc, seq_lens, q, k_cache, v_cache):
    batch = Batch(
        req_pool_indices=torch.tensor([1, 0]),
        seq_lens=torch.tensor(seq_lens),
        out_cache_loc=out_cache_loc,
    )
    layer = SimpleNamespace(layer_id=0, scaling=DIM**-0.5)
    out = torch.empty_like(q)
    fake = backend(req_to_token, k_cache, v_cache)
    return TorchTreeAttnBackend._forward_one_token(fake, q, out, layer, batch, seq_lens)


def reference(q, k_cache, v_cache, slots_per_request):
    rows = []
    for b, slots in enumerate(slots_per_request):
        keys, values = (c[slots].transpose(0, 1).unsqueeze(0) for c in (k_cache, v_cache))
        query = q[b : b + 1].transpose(0, 1).unsqueeze(0)
        rows.append(scaled_dot_product_attention(query, keys, values, scale=DIM**-0.5))
    return torch.cat([r.squeeze(0).transpose(0, 1) for r in rows]).reshape(len(rows), -1)


def test_one_node_verify_attends_to_the_prefix_and_the_verify_slot_wherever_it_is():
    torch.manual_seed(0)
    k_cache, v_cache = torch.randn(SLOTS, HEADS, DIM), torch.randn(SLOTS, HEADS, DIM)
    q = torch.randn(2, HEADS, DIM)
    seq_lens = [3, 5]  # prefix lengths of requests in pool rows 1 and 0
    req_to_token = torch.zeros(2, 8, dtype=torch.int64)
    req_to_token[1, :4] = torch.tensor([2, 9, 4, 11])  # prefix 2, 9, 4; verify slot 11
    req_to_token[0, :6] = torch.tensor([7, 1, 3, 20, 5, 13])  # prefix ...; verify slot 13
    expected = reference(q, k_cache, v_cache, [[2, 9, 4, 11], [7, 1, 3, 20, 5, 13]])
    # SGLang's layout: the verify slots are the next in each row.
    in_row = one_token_attention(
        req_to_token, torch.tensor([11, 13]), seq_lens, q, k_cache, v_cache
    )
    torch.testing.assert_close(in_row, expected)
    # A layout where the slots lie elsewhere (rows hold stale slots after the prefix): the
    # verify slots are taken from out_cache_loc, not from the rows.
    req_to_token[1, 3], req_to_token[0, 5] = 30, 31
    elsewhere = one_token_attention(
        req_to_token, torch.tensor([11, 13]), seq_lens, q, k_cache, v_cache
    )
    torch.testing.assert_close(elsewhere, expected)


def verify_input(custom_mask: torch.Tensor, ntok: int) -> EagleVerifyInput:
    """SGLang's verify input with the fields the backend reads (and one it does not)."""
    spec_info = object.__new__(EagleVerifyInput)
    spec_info.__dict__.update(custom_mask=custom_mask, draft_token_num=ntok, topk=2)
    return spec_info


def test_ragged_verify_reads_the_kept_nodes_off_the_forward_batch():
    # Two requests, a root and three nodes each: 1 and 2 children of the root, 3 a child of 1.
    torch.manual_seed(1)
    ntok, seq_lens = 4, [3, 2]
    ancestors = torch.tensor(
        [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool
    )
    custom_mask = torch.cat(
        [
            torch.cat([torch.ones(ntok, n, dtype=torch.bool), ancestors], 1).flatten()
            for n in seq_lens
        ]
    )
    k_cache, v_cache = torch.randn(SLOTS, HEADS, DIM), torch.randn(SLOTS, HEADS, DIM)
    req_to_token = torch.arange(2 * 8).view(2, 8)  # request b's prefix: row b's first slots
    batch = Batch(
        spec_info=verify_input(custom_mask, ntok),
        seq_lens=torch.tensor(seq_lens),
        req_pool_indices=torch.tensor([0, 1]),
        out_cache_loc=torch.arange(20, 20 + 2 * ntok),
    )
    layer = SimpleNamespace(
        layer_id=0, tp_q_head_num=HEADS, qk_head_dim=DIM, v_head_dim=DIM, scaling=DIM**-0.5
    )
    q = torch.randn(2 * ntok, HEADS * DIM)
    fake = backend(req_to_token, k_cache, v_cache)
    whole = TorchTreeAttnBackend._forward_verify(fake, q, None, None, layer, batch, False)

    kept = [torch.tensor([0, 1, 3]), torch.tensor([0, 2])]  # each closed under parent
    rows = torch.cat([kept[0], ntok + kept[1]])
    original = batch.spec_info
    batch.out_cache_loc = batch.out_cache_loc[rows]
    with ragged_verify(batch, kept) as ragged:
        assert batch.spec_info is ragged and isinstance(ragged, EagleVerifyInput)
        assert ragged.topk == 2 and ragged.kept_nodes is kept
        packed = TorchTreeAttnBackend._forward_verify(
            fake, q[rows], None, None, layer, batch, False
        )
        ragged.topk = 4  # what the forward sets on the input reaches SGLang's
    torch.testing.assert_close(packed, whole[rows])
    assert batch.spec_info is original and not isinstance(original, RaggedVerifyInput)
    assert original.topk == 4 and "kept_nodes" not in original.__dict__
    with pytest.raises(RuntimeError), ragged_verify(batch, kept):
        raise RuntimeError("a failed forward")
    assert batch.spec_info is original
