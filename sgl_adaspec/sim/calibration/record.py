"""Record the pair on the prompts (needs torch, transformers and the prepared models).

`Recorder` runs the target greedily (chat template, batched with left padding), then one
teacher-forced draft forward over prompt + output: per output position the draft's top-w
probabilities and the rank of the target's token among them (-1: none). Rows go to a JSONL cache,
one per prompt (`read_cache` skips a line cut by an interrupted write); `aggregate` turns them
into per-class statistics.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from sgl_adaspec.sim.calibration.prompts import Prompt
from sgl_adaspec.sim.calibration.stats import CLASSES, WIDTH, ClassAcceptance

MAX_NEW_TOKENS = 96
BATCH_SIZE = 8


def calibration_cache_dir() -> Path:
    from sgl_adaspec.models.tiny import default_cache_dir

    return default_cache_dir().parent / "calibration"


def read_cache(path: Path) -> dict[str, dict]:
    rows: dict[str, dict] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by an interrupted write
            rows[row["key"]] = row
    return rows


class Recorder:
    def __init__(self, target_dir: Path, draft_dir: Path, max_new_tokens: int):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(target_dir)
        self.tokenizer.padding_side = "left"
        self.target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
        self.draft = AutoModelForCausalLM.from_pretrained(draft_dir).eval()
        if self.tokenizer.get_vocab() != AutoTokenizer.from_pretrained(draft_dir).get_vocab():
            raise RuntimeError("target and draft tokenizers differ")
        self.dtype = str(self.target.dtype).replace("torch.", "")
        # Draft probabilities from its last hidden state with a float32 lm_head.
        self.lm_head = self.draft.lm_head.weight.detach().float()
        self.max_new_tokens = max_new_tokens
        stops = ("<|im_end|>", "<|endoftext|>")
        self.stop_ids = {self.tokenizer.convert_tokens_to_ids(t) for t in stops}

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        encoded = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt.text}], add_generation_prompt=True, return_dict=True
        )
        return list(encoded["input_ids"])

    def greedy(self, batch: list[list[int]]) -> list[list[int]]:
        torch = self.torch
        width = max(len(ids) for ids in batch)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch])
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch])
        with torch.inference_mode():
            out = self.target.generate(
                input_ids=input_ids, attention_mask=mask, max_new_tokens=self.max_new_tokens,
                do_sample=False, pad_token_id=pad, eos_token_id=sorted(self.stop_ids),
            )  # fmt: skip
        outputs = []
        for row in out[:, width:].tolist():
            kept = []
            for token in row:
                kept.append(token)
                if token in self.stop_ids:
                    break
            outputs.append(kept)
        return outputs

    def teacher_forced(self, prompt_ids: list[int], output_ids: list[int]) -> tuple[list, list]:
        """Draft's top-w probabilities [T][w] at each output position and the accepted rank."""
        torch = self.torch
        ids = torch.tensor([prompt_ids + output_ids])
        start, n = len(prompt_ids) - 1, len(output_ids)
        with torch.inference_mode():
            hidden = self.draft.model(input_ids=ids).last_hidden_state[0, start : start + n]
            probs = torch.softmax(hidden.float() @ self.lm_head.T, dim=-1)
            top_p, top_ids = probs.topk(WIDTH, dim=-1)
        target = torch.tensor(output_ids)[:, None]
        hit = top_ids == target
        rank = torch.where(hit.any(dim=1), hit.int().argmax(dim=1), torch.tensor(-1))
        return [[round(float(x), 6) for x in row] for row in top_p], rank.tolist()


def aggregate(rows: list[dict]) -> dict[str, ClassAcceptance]:
    classes = {c: ClassAcceptance() for c in CLASSES}
    for row in rows:
        if row["output_len"] > 0:
            classes[row["category"]].add(np.array(row["top_p"]), np.array(row["rank"]))
    return {c: s for c, s in classes.items() if s.positions}
