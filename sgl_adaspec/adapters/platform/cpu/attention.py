"""Tree attention for SGLang's `torch_native` backend: target verify and multi-branch draft decode.

SGLang's torch_native backend knows plain prefill/extend and one-token decode only. Speculative
decoding adds three shapes of attention, all of the form "each query row sees the request's
committed prefix plus a set of new tokens":
- TARGET_VERIFY: a request's ntok tree nodes; node i sees node j iff j is on i's root path
  (the tree mask SGLang's tree builder writes into `spec_info.custom_mask`);
- DRAFT_EXTEND(_V2): the draft re-reads new tokens causally (ordinary extend);
- draft decode step s with beam width topk: branch k's query sees the k-th branch's s+1 draft
  slots, laid out per request as [topk, num_steps] right after the prefix (SGLang's layout; see
  `cache_locs.generate_draft_decode_kv_indices`).
All are computed with one scaled_dot_product_attention call per request on gathered K/V.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import torch
from sglang.kernels.ops.speculative.spec_tree import TreeMaskMode
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.mem_cache.memory_pool import KVWriteLoc
from torch.nn.functional import scaled_dot_product_attention

from sgl_adaspec.adapters.platform.cpu.graph_emulation import sealed
from sgl_adaspec.adapters.platform.cpu.ragged_verify import RaggedVerifyInput

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """q [nq, Hq, D], k/v [nk, Hkv, D], mask [nq, nk] bool (True = may attend) or None.
    Returns [nq, Hq, Dv]. Grouped-query heads are expanded by SDPA itself."""
    q_, k_, v_ = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    if k_.dtype != q_.dtype:
        k_, v_ = k_.to(q_.dtype), v_.to(q_.dtype)
    out = scaled_dot_product_attention(
        q_, k_, v_, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
    )
    return out.squeeze(0).transpose(0, 1)


def causal_mask(num_new: int, prefix_len: int, device: torch.device) -> torch.Tensor:
    """[num_new, prefix_len + num_new]: new token i sees the prefix and new tokens <= i."""
    cols = torch.arange(prefix_len + num_new, device=device)
    rows = torch.arange(num_new, device=device).unsqueeze(1) + prefix_len
    return cols.unsqueeze(0) <= rows


class GraphMetadataFree:
    """SGLang's graph runner contract (`graph_emulation`) for backends whose forward reads the
    batch's metadata when it runs: nothing to plan before or inside a captured region."""

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        pass

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False) -> None:
        pass

    def init_forward_metadata_in_graph(self, forward_batch) -> None:
        pass


class TorchTreeAttnBackend(GraphMetadataFree, TorchNativeAttnBackend):
    """torch_native plus speculative verify and draft-extend attention (any device)."""

    tree_mask_mode = TreeMaskMode.FULL_MASK
    # The verify graph's tree mask: as SGLang's graph-capable backends keep theirs, a buffer
    # made before capture, refilled from the live batch before each replay, read inside.
    _graph_tree_mask: torch.Tensor | None = None
    # The forward whose one-node verify slots were last checked (a weak reference) and the answer.
    _slots_in_row: tuple[weakref.ref, bool] | None = None

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        ntok = max(max_num_tokens // max(max_bs, 1), 1)
        context_len = self.req_to_token_pool.req_to_token.shape[1]
        self._graph_tree_mask = torch.zeros(
            max_num_tokens * (context_len + ntok), dtype=torch.bool, device=self.device
        )

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False) -> None:
        mask = getattr(forward_batch.spec_info, "custom_mask", None)
        if (
            self._graph_tree_mask is not None
            and forward_batch.forward_mode.is_target_verify()
            and mask is not None
        ):
            self._graph_tree_mask[: mask.numel()].copy_(mask)

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        # Prefix length of padded / dummy rows (SGLang's dummy forwards and graph runners).
        return 1

    def _write_kv(self, layer: RadixAttention, forward_batch: ForwardBatch, k, v) -> None:
        if k is not None and v is not None:
            self.token_to_kv_pool.set_kv_buffer(
                layer, KVWriteLoc(forward_batch.out_cache_loc, self.swa_out_cache_loc), k, v
            )

    def _kv(self, layer: RadixAttention, slots: torch.Tensor):
        k_cache = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        v_cache = self.token_to_kv_pool.get_value_buffer(layer.layer_id)
        return k_cache[slots], v_cache[slots]

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        mode = forward_batch.forward_mode
        if layer.is_cross_attention or layer.sliding_window_size not in (None, -1):
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache)
        if mode.is_target_verify():
            return self._forward_verify(q, k, v, layer, forward_batch, save_kv_cache)
        if forward_batch.extend_seq_lens is not None and (
            mode.is_extend(include_draft_extend_v2=True)
        ):
            return self._forward_causal_extend(q, k, v, layer, forward_batch, save_kv_cache)
        return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache)

    def _forward_verify(self, q, k, v, layer, forward_batch, save_kv_cache):
        if save_kv_cache:
            self._write_kv(layer, forward_batch, k, v)
        spec_info = forward_batch.spec_info
        ntok = spec_info.draft_token_num
        seq_lens = forward_batch.seq_lens.tolist()  # prefix lengths, draft nodes excluded
        req_to_token = self.req_to_token_pool.req_to_token
        q_ = q.view(-1, layer.tp_q_head_num, layer.qk_head_dim)
        out = q.new_empty((q_.shape[0], layer.tp_q_head_num, layer.v_head_dim))
        # Ragged verify (adapters/speculative/hooks.py): request b verifies only nodes[b], packed.
        nodes = spec_info.kept_nodes if isinstance(spec_info, RaggedVerifyInput) else None
        if ntok == 1 and nodes is None:  # SGLang's steps-0 iteration: a plain decode
            return self._forward_one_token(q_, out, layer, forward_batch, seq_lens)
        custom_mask = self._graph_tree_mask if sealed() else spec_info.custom_mask
        tree = self._tree_masks(custom_mask, seq_lens, ntok)
        start = 0
        for b, prefix_len in enumerate(seq_lens):
            count = ntok if nodes is None else int(nodes[b].numel())
            rows = slice(start, start + count)
            node_mask = tree[b] if nodes is None else tree[b][nodes[b]][:, nodes[b]]
            slots = torch.cat(
                [
                    req_to_token[forward_batch.req_pool_indices[b], :prefix_len],
                    forward_batch.out_cache_loc[rows],
                ]
            )
            keys, values = self._kv(layer, slots)
            mask = torch.ones((count, prefix_len + count), dtype=torch.bool, device=q.device)
            mask[:, prefix_len:] = node_mask
            out[rows] = attend(q_[rows], keys, values, mask, layer.scaling)
            start += count
        return out.view(q.shape[0], -1)

    def _forward_one_token(self, q_, out, layer, forward_batch, seq_lens: list[int]):
        """One node per request sees its whole prefix and itself: attention without a mask,
        as a plain decode's (a mask would cost a tensor per request and layer and keep SDPA
        off its fused kernel). SGLang writes each request's verify slot right after its prefix
        in its `req_to_token` row (`assign_extend_cache_locs` from the prefix lengths), so the
        keys are one slice of the row, as in SGLang's own decode; a slot found elsewhere is
        appended instead (checked once per iteration); the slice spares the append's ~2 % of
        a plain iteration."""
        req_to_token = self.req_to_token_pool.req_to_token
        k_cache = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        v_cache = self.token_to_kv_pool.get_value_buffer(layer.layer_id)
        pools = forward_batch.req_pool_indices.tolist()
        in_row = self._slots_follow_prefix(forward_batch)
        for b, prefix_len in enumerate(seq_lens):
            if in_row:
                slots = req_to_token[pools[b], : prefix_len + 1]
            else:
                slots = torch.cat(
                    [req_to_token[pools[b], :prefix_len], forward_batch.out_cache_loc[b : b + 1]]
                )
            keys, values = k_cache[slots], v_cache[slots]
            out[b : b + 1] = attend(q_[b : b + 1], keys, values, None, layer.scaling)
        return out.view(out.shape[0], -1)

    def _slots_follow_prefix(self, forward_batch: ForwardBatch) -> bool:
        """Whether each request's one verify slot is the next in its `req_to_token` row; asked
        once per forward (the layers share its batch), each time inside a captured region."""
        asked = self._slots_in_row
        if asked is not None and asked[0]() is forward_batch and not sealed():
            return asked[1]
        bs = forward_batch.req_pool_indices.shape[0]
        rows = self.req_to_token_pool.req_to_token[
            forward_batch.req_pool_indices, forward_batch.seq_lens[:bs].long()
        ]
        in_row = bool(torch.equal(rows.long(), forward_batch.out_cache_loc[:bs].long()))
        self._slots_in_row = (weakref.ref(forward_batch), in_row)
        return in_row

    def _tree_masks(self, custom_mask: torch.Tensor, seq_lens: list[int], ntok: int):
        """Per request the [ntok, ntok] node-to-node part of SGLang's FULL_MASK layout."""
        masks, start = [], 0
        for prefix_len in seq_lens:
            row = prefix_len + ntok
            block = custom_mask[start : start + ntok * row].view(ntok, row)
            masks.append(block[:, prefix_len:])
            start += ntok * row
        return masks

    def _forward_causal_extend(self, q, k, v, layer, forward_batch, save_kv_cache):
        if save_kv_cache:
            self._write_kv(layer, forward_batch, k, v)
        req_to_token = self.req_to_token_pool.req_to_token
        q_ = q.view(-1, layer.tp_q_head_num, layer.qk_head_dim)
        out = q.new_empty((q_.shape[0], layer.tp_q_head_num, layer.v_head_dim))
        seq_lens = forward_batch.seq_lens.tolist()
        extend_lens = _as_list(forward_batch.extend_seq_lens)
        start = 0
        for b, (seq_len, num_new) in enumerate(zip(seq_lens, extend_lens)):
            prefix_len = max(seq_len - num_new, 0)  # a graph's padded rows hold too few
            rows = slice(start, start + num_new)
            slots = torch.cat(
                [
                    req_to_token[forward_batch.req_pool_indices[b], :prefix_len],
                    forward_batch.out_cache_loc[rows],
                ]
            )
            keys, values = self._kv(layer, slots)
            mask = causal_mask(num_new, prefix_len, q.device)
            out[rows] = attend(q_[rows], keys, values, mask, layer.scaling)
            start += num_new
        return out.view(q.shape[0], -1)


class TorchDraftStepBackend(TorchNativeAttnBackend):
    """One draft decode step of a beam of width topk (see module docstring)."""

    def __init__(self, model_runner, topk: int, num_steps: int, step: int):
        super().__init__(model_runner)
        self.topk, self.num_steps, self.step = topk, num_steps, step

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        if save_kv_cache and k is not None and v is not None:
            self.token_to_kv_pool.set_kv_buffer(
                layer, KVWriteLoc(forward_batch.out_cache_loc, self.swa_out_cache_loc), k, v
            )
        topk, num_steps, seen = self.topk, self.num_steps, self.step + 1
        req_to_token = self.req_to_token_pool.req_to_token
        q_ = q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim)
        out = q.new_empty((q_.shape[0], layer.tp_q_head_num, layer.v_head_dim))
        branch_cols = (
            torch.arange(topk, device=q.device).unsqueeze(1) * num_steps
            + torch.arange(seen, device=q.device).unsqueeze(0)
        ).view(-1)  # [topk * seen] columns after the prefix, branch-major
        own_branch = torch.arange(topk, device=q.device).repeat_interleave(seen)
        for b, prefix_len in enumerate(forward_batch.seq_lens.tolist()):
            rows = slice(b * topk, (b + 1) * topk)
            row = req_to_token[forward_batch.req_pool_indices[b]]
            slots = torch.cat([row[:prefix_len], row[prefix_len + branch_cols]])
            keys, values = self._kv(layer, slots)
            mask = torch.ones((topk, prefix_len + topk * seen), dtype=torch.bool, device=q.device)
            mask[:, prefix_len:] = own_branch.unsqueeze(0) == torch.arange(
                topk, device=q.device
            ).unsqueeze(1)
            out[rows] = attend(q_[rows], keys, values, mask, layer.scaling)
        return out.view(q.shape[0], -1)

    _kv = TorchTreeAttnBackend._kv
    get_cuda_graph_seq_len_fill_value = TorchTreeAttnBackend.get_cuda_graph_seq_len_fill_value


class TorchMultiStepDraftBackend(GraphMetadataFree):
    """The draft's multi-step decode backend for torch_native (mirrors SGLang's per-backend
    `*MultiStepDraftBackend` containers: one backend per draft step but the last)."""

    def __init__(self, model_runner, topk: int, speculative_num_steps: int):
        self.topk = topk
        self.speculative_num_steps = speculative_num_steps
        self.device = model_runner.device
        self.attn_backends = [
            TorchDraftStepBackend(model_runner, topk, speculative_num_steps, step)
            for step in range(speculative_num_steps - 1)
        ]

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        for backend in self.attn_backends:
            backend.init_forward_metadata(forward_batch)


def _as_list(values) -> list[int]:
    return values.tolist() if isinstance(values, torch.Tensor) else list(values)
