"""The torch EAGLE draft computes what SGLang's LlamaForCausalLMEagle computes (fast, tiny).

Three independent references:

* transformers' own LlamaDecoderLayer (its attention, RoPE, MLP) with the input_layernorm
  removed, fed ``fc(cat(embed, hidden))``, no final norm -- SGLang's draft forward over a
  causal sequence;
* the single-token forward written from SGLang's source in tests/test_fixture_models.py, on the
  tiny fixture draft that the SGLang end-to-end tests serve;
* for the later draft steps, an explicit token-by-token walk with a per-position key/value
  list, as SGLang's draft decode builds it: prefix keys from the target-fed extend, then the
  keys of the earlier draft steps on the path.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from torch.nn import functional as F
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from sgl_adaspec.models.eagle_draft import (
    CHECKPOINT_NAMES,
    DraftShape,
    EagleDraft,
    draft_config,
    export_draft,
    load_draft,
)

TARGET_CONFIG = {
    "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-5, "vocab_size": 101,
    "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
    "hidden_act": "silu", "max_position_embeddings": 256, "model_type": "llama",
    "tie_word_embeddings": True, "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 3,
}  # fmt: skip


def random_draft(seed: int = 0, config: dict = TARGET_CONFIG) -> EagleDraft:
    torch.manual_seed(seed)
    model = EagleDraft(DraftShape.from_config(config))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
        model.post_attention_layernorm.uniform_(0.5, 1.5)
    return model.eval()


def hf_layer_from(draft: EagleDraft) -> tuple[LlamaDecoderLayer, LlamaRotaryEmbedding]:
    cfg = LlamaConfig(**{k: v for k, v in TARGET_CONFIG.items() if k != "architectures"})
    cfg._attn_implementation = "sdpa"
    layer = LlamaDecoderLayer(cfg, layer_idx=0).eval()
    state = {
        "self_attn.q_proj.weight": draft.q_proj.weight,
        "self_attn.k_proj.weight": draft.k_proj.weight,
        "self_attn.v_proj.weight": draft.v_proj.weight,
        "self_attn.o_proj.weight": draft.o_proj.weight,
        "mlp.gate_proj.weight": draft.gate_proj.weight,
        "mlp.up_proj.weight": draft.up_proj.weight,
        "mlp.down_proj.weight": draft.down_proj.weight,
        "post_attention_layernorm.weight": draft.post_attention_layernorm,
        "input_layernorm.weight": torch.ones(cfg.hidden_size),
    }
    layer.load_state_dict({k: v.detach().clone() for k, v in state.items()})
    layer.input_layernorm = torch.nn.Identity()  # SGLang deletes it on the draft's layer 0
    return layer, LlamaRotaryEmbedding(cfg)


def test_sequence_forward_matches_transformers_layer_without_input_norm() -> None:
    draft = random_draft()
    gen = torch.Generator().manual_seed(1)
    embeds = torch.randn(2, 13, 64, generator=gen)
    hidden = torch.randn(2, 13, 64, generator=gen) * 3
    positions = torch.arange(13)
    layer, rope = hf_layer_from(draft)
    with torch.no_grad():
        x = draft.fc(torch.cat((embeds, hidden), dim=-1))  # embedding FIRST, fc has a bias
        cos_sin = rope(x, positions[None].expand(2, -1))
        out = layer(x, attention_mask=None, position_ids=positions[None], position_embeddings=cos_sin)
        reference = out[0] if isinstance(out, tuple) else out  # no final norm
        ours = draft(embeds, hidden, positions)
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-5)


def test_single_token_matches_sglang_reference_on_the_fixture_draft(models) -> None:
    """The tiny fixture draft served by the SGLang e2e tests, one token per sequence."""
    config = json.loads((models.eagle_draft / "config.json").read_text())
    weights = load_file(models.eagle_draft / "model.safetensors")
    draft = EagleDraft(DraftShape.from_config(config))
    draft.load_checkpoint_state(weights)
    ids = torch.arange(3, 40)
    hidden = torch.randn(len(ids), config["hidden_size"], generator=torch.Generator().manual_seed(0))
    eps, heads, kv_heads = config["rms_norm_eps"], 4, 2
    w = weights
    p = "layers.0."
    # As in tests/test_fixture_models.py: attention over a single key returns its value.
    x = torch.cat([w["embed_tokens.weight"][ids], hidden], -1) @ w["fc.weight"].T + w["fc.bias"]
    v = (x @ w[p + "self_attn.v_proj.weight"].T).unflatten(-1, (kv_heads, -1))
    x = x + v.repeat_interleave(heads // kv_heads, dim=1).flatten(1) @ w[
        p + "self_attn.o_proj.weight"
    ].T
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    h = h * w[p + "post_attention_layernorm.weight"]
    mlp = F.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)
    reference = (x + mlp @ w[p + "mlp.down_proj.weight"].T) @ w["lm_head.weight"].T
    with torch.no_grad():
        out = draft(w["embed_tokens.weight"][ids][:, None], hidden[:, None], torch.zeros(1))
        ours = out[:, 0] @ w["lm_head.weight"].T
    torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-4)


def _walk(draft: EagleDraft, embeds, hidden, t: int, steps: int) -> list[torch.Tensor]:
    """Serving order: extend over positions 0..t from target hidden states, then draft decode
    steps at t+1, t+2, ... each pairing the next embedding with the previous draft output and
    attending to every key written so far. Returns the outputs of steps 1..steps."""
    scale = draft.shape.head_dim**-0.5
    x = draft.fuse(embeds[:, : t + 1], hidden[:, : t + 1])
    q, k, v = draft.qkv(x, torch.arange(t + 1))
    attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out = draft.finish(x, attn)[:, -1:]
    outs, keys, values = [out], [k], [v]
    for s in range(2, steps + 1):
        pos = t + s - 1
        x = draft.fuse(embeds[:, pos : pos + 1], outs[-1])
        q, k, v = draft.qkv(x, torch.tensor([pos]))
        keys.append(k)
        values.append(v)
        kk, vv = torch.cat(keys, dim=2), torch.cat(values, dim=2)
        probs = torch.softmax(q @ kk.transpose(-1, -2) * scale, dim=-1)
        outs.append(draft.finish(x, probs @ vv))
    return [o[:, 0] for o in outs]


@pytest.mark.parametrize("steps", [1, 2, 4])
def test_unrolled_steps_match_token_by_token_draft_decode(steps: int) -> None:
    draft = random_draft(seed=2).double()  # float64: compare the logic, not rounding orders
    gen = torch.Generator().manual_seed(3)
    length = 11
    embeds = torch.randn(1, length, 64, generator=gen, dtype=torch.float64)
    hidden = torch.randn(1, length, 64, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        outs = draft.unrolled(embeds, hidden, torch.arange(length), steps)
        for t in range(length - steps + 1):
            walk = _walk(draft, embeds, hidden, t, steps)
            for s in range(1, steps + 1):
                j = t + s - 1  # step s of the walk that left the extend at t sits at t+s-1
                torch.testing.assert_close(outs[s - 1][:, j], walk[s - 1], rtol=1e-10, atol=1e-10)


def test_export_writes_sglang_layout_in_bf16(tmp_path) -> None:
    draft = random_draft(seed=4)
    export_draft(draft, TARGET_CONFIG, tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    assert set(weights) == set(CHECKPOINT_NAMES)  # no embed_tokens / lm_head / input_layernorm
    assert not any(name.startswith("model.") for name in weights)
    assert all(t.dtype == torch.bfloat16 for t in weights.values())
    assert weights["fc.weight"].shape == (64, 128)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config == draft_config(TARGET_CONFIG)
    assert config["architectures"] == ["LlamaForCausalLMEagle"]
    assert config["num_hidden_layers"] == 1 and config["tie_word_embeddings"] is False
    assert config["hidden_size"] == 64 and config["vocab_size"] == 101
    loaded = load_draft(tmp_path)
    for name, p in loaded.named_parameters():
        expected = dict(draft.named_parameters())[name].to(torch.bfloat16).float()
        assert torch.equal(p, expected), name
