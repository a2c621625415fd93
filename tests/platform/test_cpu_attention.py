"""The CPU tree-attention backend's one-node verify (`TorchTreeAttnBackend._forward_one_token`):
each request attends to its prefix and its verify slot, wherever SGLang put that slot. The
end-to-end tests check it against real SGLang (greedy outputs identical to no speculation);
these check both ways of reading the slots on hand-built KV pools."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch.nn.functional import scaled_dot_product_attention

from sgl_adaspec.adapters.platform.cpu.attention import TorchTreeAttnBackend

HEADS, DIM, SLOTS = 2, 4, 32


def backend(req_to_token: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor):
    """The backend's state the one-node verify reads, without a model runner."""
    fake = SimpleNamespace(
        req_to_token_pool=SimpleNamespace(req_to_token=req_to_token),
        token_to_kv_pool=SimpleNamespace(
            get_key_buffer=lambda layer_id: k_cache, get_value_buffer=lambda layer_id: v_cache
        ),
    )
    fake._slots_follow_prefix = lambda batch: TorchTreeAttnBackend._slots_follow_prefix(fake, batch)
    return fake


def one_token_attention(req_to_token, out_cache_loc, seq_lens, q, k_cache, v_cache):
    batch = SimpleNamespace(
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
