"""Deterministic tiny local models for tests and benchmarks.

Nothing is downloaded: a byte-level BPE tokenizer is trained on Python's own stdlib sources and
every model is a seeded random Llama, so the whole set builds offline in seconds.

    python -m sgl_adaspec.models.tiny [--cache-dir DIR] [--force]

Models (all float32 safetensors, one folder each, tokenizer saved into every folder):

* ``tiny-llama``         2-layer Llama target.
* ``tiny-llama-eagle``   random EAGLE draft for it, in SGLang's ``LlamaForCausalLMEagle`` layout.
* ``tiny-llama-draft``   1-layer plain Llama, a draft for STANDALONE speculative decoding.
* ``tiny-bigram``        1-layer Llama whose attention is switched off (``o_proj`` = 0), so the
                         next token depends on the current token only.
* ``tiny-bigram-eagle``  EAGLE draft computing exactly tiny-bigram's next-token distribution, so
                         greedy acceptance is 1.0 by construction.
* ``tiny-bigram-deep``   tiny-bigram plus DEEP_BIGRAM_EXTRA_LAYERS layers whose outputs are zeroed
                         (``o_proj`` = ``down_proj`` = 0): the same next-token distribution (so
                         tiny-bigram-eagle is exactly right for it too) at the forward cost of a
                         deep model, where the target's forward outweighs SGLang's per-iteration
                         work as a large model's does.

SGLang's EAGLE draft (sglang/srt/models/llama_eagle.py) differs from a plain Llama layer stack:

* input: ``fc(cat(embed_tokens(ids), target_hidden))``, embedding in the FIRST half, ``fc`` has a
  bias (plain ``nn.Linear``);
* layer 0 has no ``input_layernorm`` (attention reads the un-normalised stream);
* there is no final ``norm``: the residual stream goes straight to ``lm_head``;
* checkpoint names carry no ``model.`` prefix (the loader adds it) and ``lm_head.*`` is never
  loaded: EAGLE (v1/v2) workers bind the target's ``embed_tokens`` and ``lm_head`` into the draft.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from functools import cached_property, partial
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

# Bump whenever the output of any builder changes: cached folders with another version rebuild.
BUILD_VERSION = "sgl_adaspec.models.tiny/1"
MARKER_NAME = ".adaspec-build-complete"
CACHE_ENV = "ADASPEC_MODEL_CACHE"
PLAIN_ARCH = "LlamaForCausalLM"
EAGLE_ARCH = "LlamaForCausalLMEagle"

VOCAB_SIZE = 2048
HIDDEN = 128
HEADS = 4
KV_HEADS = 2
INTERMEDIATE = 256
DEEP_BIGRAM_EXTRA_LAYERS = 48
MAX_POSITIONS = 2048
RMS_EPS = 1e-6
INIT_STD = 0.02
CORPUS_CHARS = 2_000_000

PAD, BOS, EOS = "<pad>", "<s>", "</s>"
SPECIAL_TOKENS = (PAD, BOS, EOS)  # ids 0, 1, 2: the trainer puts specials first, in this order
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
# Role markers are plain text (several BPE pieces); enough for /v1/chat/completions to work.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{{ '<|' + m['role'] + '|>\\n' + m['content'] + eos_token + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

# Bigram construction: MLP output rms bound (keeps the per-token rescale solvable) and the
# logit of the designated successor; every other logit stays a few units below it.
BIGRAM_MLP_RMS = 0.5
BIGRAM_TOP_LOGIT = 8.0

State = dict[str, torch.Tensor]


@dataclass(frozen=True)
class TinyModels:
    target: Path
    eagle_draft: Path
    standalone_draft: Path
    bigram_target: Path
    bigram_eagle_draft: Path
    deep_bigram_target: Path


FOLDERS = {
    "target": "tiny-llama",
    "eagle_draft": "tiny-llama-eagle",
    "standalone_draft": "tiny-llama-draft",
    "bigram_target": "tiny-bigram",
    "bigram_eagle_draft": "tiny-bigram-eagle",
    "deep_bigram_target": "tiny-bigram-deep",
}


def default_cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "sgl_adaspec" / "models"


def ensure_models(cache_dir: Path | None = None, force: bool = False) -> TinyModels:
    """Build whichever models are missing or stale under ``cache_dir``; return their folders."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    paths = {field: root / name for field, name in FOLDERS.items()}
    if force or not all(_is_complete(p) for p in paths.values()):
        # One builder at a time per cache dir; late arrivals then find the markers and skip.
        with _file_lock(root / ".lock"):
            recipes = _Recipes()
            for field, path in paths.items():
                if force or not _is_complete(path):
                    _build_atomically(path, partial(recipes.write, field))
    return TinyModels(**paths)


# --------------------------------------------------------------------------- cache plumbing


def _is_complete(folder: Path) -> bool:
    marker = folder / MARKER_NAME
    return marker.is_file() and marker.read_text().strip() == BUILD_VERSION


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build_atomically(final: Path, write: Callable[[Path], None]) -> None:
    """Write into a sibling temp dir, marker last, then rename: readers never see half a model."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        write(tmp)
        (tmp / MARKER_NAME).write_text(BUILD_VERSION + "\n")
        _make_world_readable(tmp)
        if final.exists():
            # A stale or forced folder: move it aside first, since rename cannot replace a
            # non-empty directory; removal happens after the new one is in place.
            trash = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
            final.rename(trash / final.name)
            tmp.rename(final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _make_world_readable(folder: Path) -> None:
    # mkdtemp and safetensors create owner-only entries; a server may run as another user.
    folder.chmod(0o755)
    for path in folder.iterdir():
        path.chmod(0o644)


# --------------------------------------------------------------------------- tokenizer


def _stdlib_texts(max_chars: int = CORPUS_CHARS) -> list[str]:
    """First ``max_chars`` of stdlib ``*.py`` sources, in a fixed (sorted) walk order."""
    root = sysconfig.get_paths()["stdlib"]
    texts: list[str] = []
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        # Installed packages differ between machines; only the stdlib itself is reproducible.
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "__pycache__"))
        for name in sorted(f for f in filenames if f.endswith(".py")):
            with open(os.path.join(dirpath, name), encoding="utf-8", errors="replace") as f:
                text = f.read(max_chars - total)
            texts.append(text)
            total += len(text)
            if total >= max_chars:
                return texts
    return texts


def train_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        # All 256 byte symbols up front, so any text (not just stdlib-like) round-trips.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_stdlib_texts(), trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    assert [wrapped.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [PAD_ID, BOS_ID, EOS_ID]
    return wrapped


# --------------------------------------------------------------------------- weights


def llama_config(num_layers: int, vocab_size: int, architecture: str) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=num_layers,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=RMS_EPS,
        tie_word_embeddings=False,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        architectures=[architecture],
        dtype="float32",
    )


def _hf_shapes(config: LlamaConfig) -> dict[str, torch.Size]:
    # Meta device: parameter names and shapes straight from transformers, no allocation/init.
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    return {name: t.shape for name, t in model.state_dict().items()}


def random_state(shapes: dict[str, torch.Size], seed: int, std: float = INIT_STD) -> State:
    """Norm weights 1, everything else N(0, std), drawn in sorted-name order.

    Our own init (not transformers') keeps the bytes independent of the transformers version.
    """
    gen = torch.Generator().manual_seed(seed)
    state: State = {}
    for name in sorted(shapes):
        if name.endswith("norm.weight"):
            state[name] = torch.ones(shapes[name])
        else:
            state[name] = torch.randn(shapes[name], generator=gen) * std
    return state


def eagle_state_from(layer_state: State, fc_weight: torch.Tensor, fc_bias: torch.Tensor) -> State:
    """Map a 1-layer HF Llama state to LlamaForCausalLMEagle checkpoint names.

    Drops what SGLang's draft has no slot for: ``layers.0.input_layernorm`` and the final
    ``norm``; strips ``model.`` (its loader re-adds it to every non-``lm_head`` name).
    """
    state: State = {"fc.weight": fc_weight, "fc.bias": fc_bias}
    for name, tensor in layer_state.items():
        short = name.removeprefix("model.")
        if short in ("norm.weight", "layers.0.input_layernorm.weight"):
            continue
        state[short] = tensor
    return state


def _rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS) * weight


def _bigram_mlp(state: State, x: torch.Tensor) -> torch.Tensor:
    """The layer-0 MLP branch on residual ``x`` (attention is off), as both models compute it."""
    p = "model.layers.0."
    h = _rms_norm(x, state[p + "post_attention_layernorm.weight"])
    gate = h @ state[p + "mlp.gate_proj.weight"].T
    up = h @ state[p + "mlp.up_proj.weight"].T
    return (torch.nn.functional.silu(gate) * up) @ state[p + "mlp.down_proj.weight"].T


def make_bigram(state: State, seed: int) -> State:
    """Turn a random 1-layer Llama state into a bigram model an EAGLE draft can match exactly.

    * ``o_proj`` = 0: attention adds nothing, so the output depends on the current token only.
    * The EAGLE draft has no final norm, so the target's final norm must be the identity:
      weight 1, and every token's pre-norm residual rescaled to rms 1 (RMSNorm is scale
      invariant, so scaling the embedding row leaves the MLP branch unchanged and the rms is
      solvable per token).  Then target logits == draft logits up to a 1/sqrt(1+eps) factor.
    * ``lm_head`` gives each token one designated successor, several logits ahead of the rest,
      so argmax cannot flip under fp16/bf16 serving (SGLang downcasts fp32 models to fp16).
    """
    state = {k: v.clone() for k, v in state.items()}
    p = "model.layers.0."
    state[p + "self_attn.o_proj.weight"].zero_()
    state["model.norm.weight"].fill_(1.0)
    state[p + "post_attention_layernorm.weight"] = _positive_gain(state, p, seed)
    embed = state["model.embed_tokens.weight"]
    embed /= embed.pow(2).mean(-1, keepdim=True).sqrt()  # rms 1, so the norm eps is negligible
    branch = _bigram_mlp(state, embed)
    branch_rms = branch.pow(2).mean(-1).sqrt().max()
    state[p + "mlp.down_proj.weight"] *= BIGRAM_MLP_RMS / branch_rms
    for _ in range(3):  # fixed point: eps makes RMSNorm only *almost* scale invariant
        embed *= _unit_rms_scale(embed, _bigram_mlp(state, embed)).unsqueeze(-1)
    residual = embed + _bigram_mlp(state, embed)
    state["lm_head.weight"] = _successor_head(residual, seed)
    return state


def _positive_gain(state: State, prefix: str, seed: int) -> torch.Tensor:
    # Non-trivial gains, so a test catches a draft that forgets to copy this norm.
    gen = torch.Generator().manual_seed(seed + 1)
    shape = state[prefix + "post_attention_layernorm.weight"].shape
    return 1.0 + 0.2 * torch.rand(shape, generator=gen)


def _unit_rms_scale(e: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Per row, the c > 0 with rms(c*e + m) == 1: positive root of a quadratic in c.

    It exists because rms(m) < 1 makes the constant term negative.
    """
    a = e.pow(2).sum(-1)
    b = 2 * (e * m).sum(-1)
    c = m.pow(2).sum(-1) - e.shape[-1]
    return (-b + (b * b - 4 * a * c).sqrt()) / (2 * a)


def _successor_head(residual: torch.Tensor, seed: int) -> torch.Tensor:
    """lm_head whose argmax walks one cycle through every non-EOS token (EOS is never argmax).

    Row j is the sum of the unit residuals of the tokens whose successor is j; residual rows
    are near-orthogonal random vectors, so the successor's logit stands well above the rest.
    """
    vocab, hidden = residual.shape
    gen = torch.Generator().manual_seed(seed + 2)
    tokens = torch.tensor([t for t in range(vocab) if t != EOS_ID])
    order = tokens[torch.randperm(len(tokens), generator=gen)]
    successor = torch.empty(vocab, dtype=torch.long)
    successor[order] = order.roll(-1)
    successor[EOS_ID] = order[0]
    unit = residual / residual.norm(dim=-1, keepdim=True)
    head = torch.zeros(vocab, hidden)
    head.index_add_(0, successor, unit)
    # residual rms is 1, i.e. norm sqrt(hidden): scale so the successor logit is TOP_LOGIT.
    return head * (BIGRAM_TOP_LOGIT / hidden**0.5)


def with_dead_layers(state: State, extra: int, layer_config: LlamaConfig, seed: int) -> State:
    """`state` (a 1-layer Llama) followed by `extra` random layers whose attention and MLP
    outputs are zeroed (o_proj = down_proj = 0): each computes in full and adds nothing to the
    residual stream, so the model's outputs are `state`'s."""
    state = dict(state)
    layer = {
        name.removeprefix("model.layers.0."): shape
        for name, shape in _hf_shapes(layer_config).items()
        if name.startswith("model.layers.0.")
    }
    for i in range(1, extra + 1):
        weights = random_state(layer, seed=seed + i)
        weights["self_attn.o_proj.weight"].zero_()
        weights["mlp.down_proj.weight"].zero_()
        state.update({f"model.layers.{i}.{name}": w for name, w in weights.items()})
    return state


def bigram_eagle_state(bigram: State) -> State:
    """EAGLE draft equal to the bigram target on every token.

    fc = [I | 0] with zero bias: the draft's stream starts as the token embedding and the target
    hidden state (second half) is ignored.  Layer 0 then computes embed + 0 (o_proj = 0; the
    missing input_layernorm only feeds the zeroed attention) + MLP(post_attention_layernorm(.))
    exactly like the target's single layer; the missing final norm is harmless because
    make_bigram made the target's final norm the identity on these residuals.
    """
    fc_weight = torch.cat([torch.eye(HIDDEN), torch.zeros(HIDDEN, HIDDEN)], dim=1)
    return eagle_state_from(bigram, fc_weight, torch.zeros(HIDDEN))


# --------------------------------------------------------------------------- writers


def save_state(state: State, folder: Path) -> None:
    tensors = {k: v.detach().to(torch.float32).contiguous() for k, v in sorted(state.items())}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def save_config(config: LlamaConfig, folder: Path) -> None:
    config.save_pretrained(folder)
    generation = GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    generation.save_pretrained(folder)


@dataclass
class _Recipes:
    """Lazily computed tokenizer and weights, shared by the writers of one build."""

    @cached_property
    def tokenizer(self) -> PreTrainedTokenizerFast:
        return train_tokenizer()

    @cached_property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def config(self, num_layers: int, architecture: str = PLAIN_ARCH) -> LlamaConfig:
        return llama_config(num_layers, self.vocab_size, architecture)

    @cached_property
    def target(self) -> State:
        return random_state(_hf_shapes(self.config(2)), seed=1000)

    @cached_property
    def standalone_draft(self) -> State:
        return random_state(_hf_shapes(self.config(1)), seed=2000)

    @cached_property
    def eagle_draft(self) -> State:
        # A 1-layer block with random weights, sharing the target's embeddings and head (as
        # SGLang's EAGLE worker binds them anyway); fc is random too, so acceptance is low.
        block = random_state(_hf_shapes(self.config(1)), seed=3000)
        block["model.embed_tokens.weight"] = self.target["model.embed_tokens.weight"]
        block["lm_head.weight"] = self.target["lm_head.weight"]
        gen = torch.Generator().manual_seed(3001)
        fc_weight = torch.randn(HIDDEN, 2 * HIDDEN, generator=gen) * INIT_STD
        fc_bias = torch.randn(HIDDEN, generator=gen) * INIT_STD
        return eagle_state_from(block, fc_weight, fc_bias)

    @cached_property
    def bigram(self) -> State:
        return make_bigram(random_state(_hf_shapes(self.config(1)), seed=4000), seed=4000)

    @cached_property
    def bigram_eagle(self) -> State:
        return bigram_eagle_state(self.bigram)

    @cached_property
    def deep_bigram(self) -> State:
        return with_dead_layers(self.bigram, DEEP_BIGRAM_EXTRA_LAYERS, self.config(1), seed=5000)

    def write(self, field: str, folder: Path) -> None:
        """Write the model behind TinyModels.<field> into ``folder``."""
        layers, architecture, weights = {
            "target": (2, PLAIN_ARCH, lambda: self.target),
            "eagle_draft": (1, EAGLE_ARCH, lambda: self.eagle_draft),
            "standalone_draft": (1, PLAIN_ARCH, lambda: self.standalone_draft),
            "bigram_target": (1, PLAIN_ARCH, lambda: self.bigram),
            "bigram_eagle_draft": (1, EAGLE_ARCH, lambda: self.bigram_eagle),
            "deep_bigram_target": (
                1 + DEEP_BIGRAM_EXTRA_LAYERS,
                PLAIN_ARCH,
                lambda: self.deep_bigram,
            ),
        }[field]
        save_state(weights(), folder)
        save_config(self.config(layers, architecture), folder)
        self.tokenizer.save_pretrained(folder)


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cache-dir", type=Path, help=f"default: ${CACHE_ENV} or ~/.cache/sgl_adaspec/models"
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    built = ensure_models(args.cache_dir, force=args.force)
    elapsed = time.perf_counter() - start
    print(json.dumps({f.name: str(getattr(built, f.name)) for f in fields(built)}, indent=2))
    print(f"ready in {elapsed:.1f}s")


if __name__ == "__main__":
    main()
