"""An EAGLE draft in SGLang's ``LlamaForCausalLMEagle`` layout, as a plain torch module.

SGLang 0.5.23 serves the draft like this (sglang/srt/models/llama_eagle.py, speculative/
eagle_worker_v2.py, layers/logits_processor.py):

* input at position ``t``: ``fc(cat(embed(token[t + 1]), target_hidden[t]))`` -- the embedding
  in the FIRST half, ``fc`` with a bias. ``target_hidden[t]`` is the target's last hidden state
  AFTER its final norm (what its logits processor receives; CaptureHiddenMode.FULL stores exactly
  that tensor). Draft extend shifts the ids left by one and appends the token the target just
  produced, so the pair at position ``t`` is (token t+1, hidden t) and it predicts token t+2;
  RoPE uses position ``t``;
* one decoder layer whose attention reads the un-normalised stream (no ``input_layernorm``),
  then residual add, post-attention RMSNorm, SiLU MLP, residual add;
* no final norm: the residual stream goes straight to the lm_head, and it is also the hidden
  state handed to the next draft step (which pairs it with the embedding of the drafted token);
* the worker binds the target's ``embed_tokens`` and ``lm_head`` into the draft, so the
  checkpoint needs neither (names carry no ``model.`` prefix; the loader adds it).

``EagleDraft`` computes that forward for whole sequences (training, teacher-forced evaluation)
and ``unrolled`` adds the later draft steps, where a position's input hidden state is the
draft's own output at the previous position and its attention sees the target-fed keys of the
prefix plus the keys of the earlier draft steps on its own path, as in SGLang's draft tree.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn import functional as F

EAGLE_ARCH = "LlamaForCausalLMEagle"
WEIGHTS_FILE = "model.safetensors"

# Checkpoint name (SGLang's, without "model.") -> EagleDraft parameter name.
CHECKPOINT_NAMES = {
    "fc.weight": "fc.weight",
    "fc.bias": "fc.bias",
    "layers.0.self_attn.q_proj.weight": "q_proj.weight",
    "layers.0.self_attn.k_proj.weight": "k_proj.weight",
    "layers.0.self_attn.v_proj.weight": "v_proj.weight",
    "layers.0.self_attn.o_proj.weight": "o_proj.weight",
    "layers.0.post_attention_layernorm.weight": "post_attention_layernorm",
    "layers.0.mlp.gate_proj.weight": "gate_proj.weight",
    "layers.0.mlp.up_proj.weight": "up_proj.weight",
    "layers.0.mlp.down_proj.weight": "down_proj.weight",
}


@dataclass(frozen=True)
class DraftShape:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int

    @classmethod
    def from_config(cls, config: dict) -> "DraftShape":
        rope = config.get("rope_parameters") or {}
        theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
        heads = config["num_attention_heads"]
        return cls(
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            num_attention_heads=heads,
            num_key_value_heads=config.get("num_key_value_heads", heads),
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            rms_norm_eps=config["rms_norm_eps"],
            rope_theta=float(theta),
            vocab_size=config["vocab_size"],
        )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x = x.to(torch.promote_types(dtype, torch.float32))  # at least fp32, as SGLang/HF do
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class EagleDraft(nn.Module):
    """fc + one Llama decoder layer without input_layernorm, no final norm.

    Shapes: ``embeds`` and ``target_hidden`` are (batch, length, hidden); ``positions`` is
    (length,) or (batch, length). The lm_head (the target's) is passed to ``logits``.
    """

    def __init__(self, shape: DraftShape):
        super().__init__()
        self.shape = shape
        h, d = shape.hidden_size, shape.head_dim
        self.fc = nn.Linear(2 * h, h, bias=True)
        self.q_proj = nn.Linear(h, shape.num_attention_heads * d, bias=False)
        self.k_proj = nn.Linear(h, shape.num_key_value_heads * d, bias=False)
        self.v_proj = nn.Linear(h, shape.num_key_value_heads * d, bias=False)
        self.o_proj = nn.Linear(shape.num_attention_heads * d, h, bias=False)
        self.post_attention_layernorm = nn.Parameter(torch.ones(h))
        self.gate_proj = nn.Linear(h, shape.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, shape.intermediate_size, bias=False)
        self.down_proj = nn.Linear(shape.intermediate_size, h, bias=False)
        inv_freq = 1.0 / (shape.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    # ----------------------------------------------------------------- pieces of the layer

    def fuse(self, embeds: torch.Tensor, target_hidden: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat((embeds, target_hidden), dim=-1))

    def qkv(self, x: torch.Tensor, positions: torch.Tensor):
        """(B, L, H) -> q (B, heads, L, d), k and v (B, heads, L, d) with kv heads repeated."""
        s = self.shape
        b, length, _ = x.shape
        q = self.q_proj(x).view(b, length, s.num_attention_heads, s.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, length, s.num_key_value_heads, s.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, length, s.num_key_value_heads, s.head_dim).transpose(1, 2)
        angles = positions.to(self.inv_freq.dtype)[..., None] * self.inv_freq  # (.., L, d/2)
        angles = torch.cat((angles, angles), dim=-1)
        if angles.dim() == 3:
            angles = angles[:, None]  # per-batch positions: broadcast over heads
        cos, sin = angles.cos().to(q.dtype), angles.sin().to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        groups = s.num_attention_heads // s.num_key_value_heads
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
        return q, k, v

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual add of the attention output (B, heads, L, d), then the MLP half."""
        b, _, length, _ = attn.shape
        x = x + self.o_proj(attn.transpose(1, 2).reshape(b, length, -1))
        h = rms_norm(x, self.post_attention_layernorm, self.shape.rms_norm_eps)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))

    # ----------------------------------------------------------------- forwards

    def forward(
        self, embeds: torch.Tensor, target_hidden: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """Causal draft forward over whole sequences: returns the draft hidden states."""
        x = self.fuse(embeds, target_hidden)
        q, k, v = self.qkv(x, positions)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.finish(x, attn)

    def unrolled(
        self,
        embeds: torch.Tensor,
        target_hidden: torch.Tensor,
        positions: torch.Tensor,
        steps: int,
    ) -> list[torch.Tensor]:
        """Draft steps 1..steps over whole sequences at once (teacher-forced tokens).

        Step 1 is ``forward``. At step s > 1, position j pairs ``embeds[j]`` with the step s-1
        output at j-1 (the draft's own hidden state, as SGLang's draft decode does) and attends
        to the step-1 keys of positions <= j-s+1 (the prefix the draft extend wrote from target
        hidden states) plus, for r = 2..s, the step-r key at position j-(s-r) (the earlier draft
        tokens on its path). Positions j < s-1 have no such history; their outputs are
        meaningless and must be masked by the caller. Returns [out_1, ..., out_steps].
        """
        x1 = self.fuse(embeds, target_hidden)
        q1, k1, v1 = self.qkv(x1, positions)
        out = self.finish(x1, F.scaled_dot_product_attention(q1, k1, v1, is_causal=True))
        outs = [out]
        keys, values = [], []  # step r >= 2 keys/values, aligned to their own positions
        length = embeds.shape[1]
        scale = self.shape.head_dim**-0.5
        idx = torch.arange(length, device=embeds.device)
        for s in range(2, steps + 1):
            prev = F.pad(outs[-1][:, :-1], (0, 0, 1, 0))  # output at j-1, zeros at j=0
            x = self.fuse(embeds, prev)
            q, k, v = self.qkv(x, positions)
            keys.append(k)
            values.append(v)
            scores = torch.matmul(q, k1.transpose(-1, -2)) * scale  # (B, heads, L, L)
            allowed = idx[None, :] <= (idx[:, None] - s + 1)
            scores = scores.masked_fill(~allowed, float("-inf"))
            diag_scores, diag_values = [], []
            for r in range(2, s + 1):
                shift = s - r  # step-r key at position j - shift
                kr = _shift_right(keys[r - 2], shift)
                vr = _shift_right(values[r - 2], shift)
                diag_scores.append((q * kr).sum(-1, keepdim=True) * scale)
                diag_values.append(vr)
            logits = torch.cat([scores, *diag_scores], dim=-1)
            probs = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)
            probs = probs.to(v1.dtype)
            attn = torch.matmul(probs[..., :length], v1)
            for i, vr in enumerate(diag_values):
                attn = attn + probs[..., length + i : length + i + 1] * vr
            outs.append(self.finish(x, attn))
        return outs

    # ----------------------------------------------------------------- checkpoints

    def checkpoint_state(self, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
        own = dict(self.named_parameters())
        return {
            ckpt: own[name].detach().to(dtype).contiguous() for ckpt, name in CHECKPOINT_NAMES.items()
        }

    def load_checkpoint_state(self, state: dict[str, torch.Tensor]) -> None:
        own = dict(self.named_parameters())
        with torch.no_grad():
            for ckpt, name in CHECKPOINT_NAMES.items():
                own[name].copy_(state[ckpt].to(own[name].dtype))


def _shift_right(t: torch.Tensor, shift: int) -> torch.Tensor:
    """t (B, heads, L, d) with position j holding t[j - shift] (zeros before the start)."""
    if shift == 0:
        return t
    return F.pad(t[:, :, :-shift], (0, 0, shift, 0))


def draft_config(target_config: dict) -> dict:
    """The draft's config.json: the target's sizes, one layer, SGLang's EAGLE architecture.

    ``tie_word_embeddings`` is false on purpose: the worker binds the target's embedding and
    lm_head separately (``set_embed_and_head`` deletes both weights, which fails when tied).
    """
    keep = (
        "attention_bias", "bos_token_id", "eos_token_id", "head_dim", "hidden_act",
        "hidden_size", "intermediate_size", "max_position_embeddings", "mlp_bias",
        "model_type", "num_attention_heads", "num_key_value_heads", "pad_token_id",
        "rms_norm_eps", "rope_parameters", "rope_theta", "rope_scaling", "vocab_size",
    )  # fmt: skip
    config = {k: target_config[k] for k in keep if k in target_config}
    config.update(
        architectures=[EAGLE_ARCH],
        num_hidden_layers=1,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    return config


def export_draft(model: EagleDraft, target_config: dict, folder: Path, extra: dict | None = None):
    """Write config.json + bf16 model.safetensors (fc + layer 0 only) into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (WEIGHTS_FILE + ".tmp")
    metadata = {"format": "pt", **{k: str(v) for k, v in (extra or {}).items()}}
    save_file(model.checkpoint_state(), str(tmp), metadata=metadata)
    tmp.chmod(0o644)  # safetensors writes owner-only files; a server may run as another user
    tmp.replace(folder / WEIGHTS_FILE)
    (folder / "config.json").write_text(json.dumps(draft_config(target_config), indent=2) + "\n")


def load_draft(folder: Path, dtype: torch.dtype = torch.float32) -> EagleDraft:
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    model = EagleDraft(DraftShape.from_config(config)).to(dtype)
    model.load_checkpoint_state(load_file(str(folder / WEIGHTS_FILE)))
    return model.eval()


def shape_dict(shape: DraftShape) -> dict:
    return asdict(shape)
