"""The tiny fixture models behave as advertised (CPU, HF transformers only, no SGLang server)."""

from __future__ import annotations

import hashlib
from dataclasses import fields
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from sgl_adaspec.models.tiny import (
    BUILD_VERSION,
    DEEP_BIGRAM_EXTRA_LAYERS,
    EOS_ID,
    MARKER_NAME,
    VOCAB_SIZE,
    TinyModels,
    ensure_models,
)

HF_MODELS = ("target", "standalone_draft", "bigram_target")
EAGLE_KEYS = {
    "embed_tokens.weight",
    "fc.weight",
    "fc.bias",
    "layers.0.post_attention_layernorm.weight",
    "layers.0.self_attn.q_proj.weight",
    "layers.0.self_attn.k_proj.weight",
    "layers.0.self_attn.v_proj.weight",
    "layers.0.self_attn.o_proj.weight",
    "layers.0.mlp.gate_proj.weight",
    "layers.0.mlp.up_proj.weight",
    "layers.0.mlp.down_proj.weight",
    "lm_head.weight",
}


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return ensure_models(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def bigram(tiny: TinyModels) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(tiny.bigram_target).eval()


def _folder_hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _all_hashes(models: TinyModels) -> dict[str, dict[str, str]]:
    return {f.name: _folder_hashes(getattr(models, f.name)) for f in fields(models)}


def test_every_folder_is_complete(tiny: TinyModels) -> None:
    for f in fields(tiny):
        folder = getattr(tiny, f.name)
        assert (folder / MARKER_NAME).read_text().strip() == BUILD_VERSION
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(
            p.name for p in folder.iterdir()
        )
        weights = load_file(folder / "model.safetensors")
        assert all(t.dtype == torch.float32 for t in weights.values())


@pytest.mark.parametrize("field", [f.name for f in fields(TinyModels)])
def test_tokenizer_round_trips_and_chats(tiny: TinyModels, field: str) -> None:
    tok = AutoTokenizer.from_pretrained(getattr(tiny, field))
    assert len(tok) == VOCAB_SIZE
    assert (tok.pad_token, tok.bos_token, tok.eos_token) == ("<pad>", "<s>", "</s>")
    text = "def f(x: int) -> str:\n    return f'{x!r} ünïcødé ✓'\n"
    ids = tok(text)["input_ids"]
    assert len(ids) < len(text.encode())  # BPE merges actually learned something
    assert tok.decode(ids) == text
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<s><|user|>\nhi</s>\n<|assistant|>\n"


def test_hf_models_load_with_expected_shapes(tiny: TinyModels) -> None:
    layers = {"target": 2, "standalone_draft": 1, "bigram_target": 1}
    for field in HF_MODELS:
        model = AutoModelForCausalLM.from_pretrained(getattr(tiny, field))
        cfg = model.config
        assert cfg.architectures == ["LlamaForCausalLM"]
        assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == (
            layers[field],
            128,
            VOCAB_SIZE,
        )
        assert model.dtype == torch.float32
        assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)


def test_eagle_configs_name_sglang_architecture(tiny: TinyModels) -> None:
    for folder in (tiny.eagle_draft, tiny.bigram_eagle_draft):
        cfg = AutoConfig.from_pretrained(folder)
        assert cfg.architectures == ["LlamaForCausalLMEagle"]
        assert (cfg.num_hidden_layers, cfg.hidden_size) == (1, 128)


def test_target_greedy_generation_is_not_degenerate(tiny: TinyModels) -> None:
    tok = AutoTokenizer.from_pretrained(tiny.target)
    model = AutoModelForCausalLM.from_pretrained(tiny.target).eval()
    inputs = tok("import os\nclass Foo:", return_tensors="pt")
    out = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    new = out[0, inputs["input_ids"].shape[1] :].tolist()
    assert len(new) == 16
    assert len(set(new)) > 1


def test_bigram_depends_on_last_token_only(bigram: torch.nn.Module) -> None:
    gen = torch.Generator().manual_seed(0)
    last = torch.randint(3, VOCAB_SIZE, (64, 1), generator=gen)
    reference = None
    for prefix_len in (0, 3, 17):
        prefix = torch.randint(3, VOCAB_SIZE, (64, prefix_len), generator=gen)
        with torch.no_grad():
            logits = bigram(torch.cat([prefix, last], dim=1)).logits[:, -1]
        if reference is None:
            reference = logits
        assert torch.equal(logits.argmax(-1), reference.argmax(-1))
        torch.testing.assert_close(logits, reference, rtol=0, atol=1e-4)


def test_deep_bigram_computes_the_bigram(tiny: TinyModels, bigram: torch.nn.Module) -> None:
    deep = AutoModelForCausalLM.from_pretrained(tiny.deep_bigram_target).eval()
    assert deep.config.num_hidden_layers == 1 + DEEP_BIGRAM_EXTRA_LAYERS
    # Its extra layers compute (random weights) and add nothing to the residual stream.
    assert deep.model.layers[1].self_attn.q_proj.weight.abs().sum() > 0
    ids = torch.randint(3, VOCAB_SIZE, (4, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(deep(ids).logits, bigram(ids).logits, rtol=0, atol=1e-5)


def test_eagle_checkpoints_use_sglang_layout(tiny: TinyModels) -> None:
    target = load_file(tiny.target / "model.safetensors")
    for folder in (tiny.eagle_draft, tiny.bigram_eagle_draft):
        draft = load_file(folder / "model.safetensors")
        assert set(draft) == EAGLE_KEYS  # no model. prefix, input_layernorm or final norm
        assert draft["fc.weight"].shape == (128, 256)
    random_draft = load_file(tiny.eagle_draft / "model.safetensors")
    assert torch.equal(random_draft["embed_tokens.weight"], target["model.embed_tokens.weight"])
    assert torch.equal(random_draft["lm_head.weight"], target["lm_head.weight"])


def test_bigram_eagle_weights_mirror_the_target(tiny: TinyModels) -> None:
    target = load_file(tiny.bigram_target / "model.safetensors")
    draft = load_file(tiny.bigram_eagle_draft / "model.safetensors")
    assert torch.equal(draft["fc.weight"], torch.cat([torch.eye(128), torch.zeros(128, 128)], 1))
    assert not draft["fc.bias"].any()
    assert not draft["layers.0.self_attn.o_proj.weight"].any()
    assert not target["model.layers.0.self_attn.o_proj.weight"].any()
    for name in EAGLE_KEYS - {"fc.weight", "fc.bias"}:
        hf_name = name if name == "lm_head.weight" else "model." + name
        assert torch.equal(draft[name], target[hf_name]), name


def _sglang_eagle_forward(
    w: dict[str, torch.Tensor], ids: torch.Tensor, target_hidden: torch.Tensor
) -> torch.Tensor:
    """LlamaForCausalLMEagle on one token per sequence, as sglang/srt/models/llama_eagle.py does.

    fc over cat(embedding, target hidden); layer 0 without input_layernorm; attention over a
    single position returns that position's value vector (softmax over one key is 1, so q, k and
    rope drop out); post-attention RMSNorm + SiLU MLP; residual adds; NO final norm; lm_head.
    """
    eps, heads, kv_heads = 1e-6, 4, 2

    def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    p = "layers.0."
    x = torch.cat([w["embed_tokens.weight"][ids], target_hidden], -1) @ w["fc.weight"].T
    x = x + w["fc.bias"]
    v = (x @ w[p + "self_attn.v_proj.weight"].T).unflatten(-1, (kv_heads, -1))
    v = v.repeat_interleave(heads // kv_heads, dim=1).flatten(1)  # GQA: each kv head serves 2
    x = x + v @ w[p + "self_attn.o_proj.weight"].T
    h = rms_norm(x, w[p + "post_attention_layernorm.weight"])
    gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
    x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    return x @ w["lm_head.weight"].T


def test_bigram_eagle_reproduces_target_for_every_token(
    tiny: TinyModels, bigram: torch.nn.Module
) -> None:
    ids = torch.arange(VOCAB_SIZE)
    with torch.no_grad():
        target_logits = bigram(ids[:, None]).logits[:, 0]
    draft = load_file(tiny.bigram_eagle_draft / "model.safetensors")
    # The target hidden state fed to the draft must not matter: fc zeroes its half.
    hidden = torch.randn(VOCAB_SIZE, 128, generator=torch.Generator().manual_seed(0)) * 3
    draft_logits = _sglang_eagle_forward(draft, ids, hidden)

    assert torch.equal(draft_logits.argmax(-1), target_logits.argmax(-1))
    # Not just the argmax: the whole distribution matches (target's final norm is an identity).
    torch.testing.assert_close(draft_logits, target_logits, rtol=0, atol=1e-4)
    # Margin large enough that fp16/bf16 serving cannot flip any argmax.
    top2 = target_logits.topk(2, dim=-1).values
    assert (top2[:, 0] - top2[:, 1]).min() > 2.0
    # Greedy walk never emits EOS and is not stuck on a few tokens.
    assert not (target_logits.argmax(-1) == EOS_ID).any()
    assert target_logits.argmax(-1).unique().numel() == VOCAB_SIZE - 1


def test_rebuild_is_byte_identical_and_idempotent(
    tiny: TinyModels, tmp_path_factory: pytest.TempPathFactory
) -> None:
    again = ensure_models(tmp_path_factory.mktemp("models-again"))
    assert _all_hashes(again) == _all_hashes(tiny)

    # Up to date: nothing is rewritten.
    files = [p for f in fields(again) for p in getattr(again, f.name).iterdir()]
    stamps = {p: p.stat().st_mtime_ns for p in files}
    ensure_models(again.target.parent)
    assert stamps == {p: p.stat().st_mtime_ns for p in stamps}

    # A marker from another builder version rebuilds that folder only, to the same bytes.
    (again.standalone_draft / MARKER_NAME).write_text("older-version\n")
    target_inode = again.target.stat().st_ino
    ensure_models(again.target.parent)
    assert (again.standalone_draft / MARKER_NAME).read_text().strip() == BUILD_VERSION
    assert again.target.stat().st_ino == target_inode
    assert _all_hashes(again) == _all_hashes(tiny)
