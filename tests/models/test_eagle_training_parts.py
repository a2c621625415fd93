"""Pieces of the draft training pipeline on tiny data (fast; the real run is hours long)."""

from __future__ import annotations

import json
import random

import torch

from sgl_adaspec.models import eagle_data_plan
from sgl_adaspec.models.copy_rule import copy_rule_guesses
from sgl_adaspec.models.eagle_data import (
    Shard,
    iter_sharegpt,
    spec_bench_heldout_categories,
    spec_bench_split,
)
from sgl_adaspec.models.eagle_data_plan import length_batches
from sgl_adaspec.models.eagle_draft import DraftShape
from sgl_adaspec.models.eagle_loss import (
    draft_losses,
    generated_positions,
    sequence_inputs,
    training_selection,
)
from sgl_adaspec.models.eagle_shard_pool import ShardPool, estimated_uses
from sgl_adaspec.models.train_eagle import init_draft

SHAPE = DraftShape(
    hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
    head_dim=8, rms_norm_eps=1e-5, rope_theta=10000.0, vocab_size=50,
)  # fmt: skip


def test_sharegpt_reader_survives_a_cut_file(tmp_path) -> None:
    convs = [
        {"id": "a", "conversations": [{"from": "human", "value": "hi"},
                                      {"from": "gpt", "value": "hello"}]},
        {"id": "b", "conversations": [{"from": "gpt", "value": "starts with gpt"}]},
        {"id": "c", "conversations": [{"from": "human", "value": "second"}]},
    ]  # fmt: skip
    text = json.dumps(convs, indent=2)
    path = tmp_path / "cut.json"
    path.write_text(text[: text.index('"c"') + 40])  # cut inside the third element
    got = list(iter_sharegpt(path))
    assert got == [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]]
    path.write_text(text)
    assert len(list(iter_sharegpt(path))) == 2


def test_spec_bench_heldout_is_every_sixth_question(tmp_path) -> None:
    path = tmp_path / "q.jsonl"
    rows = [{"turns": [f"q{i}", "x"], "category": f"c{i % 4}"} for i in range(12)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    train, heldout = spec_bench_split(path)
    assert heldout == ["q5", "q11"]
    assert len(train) == 10 and not set(train) & set(heldout)
    assert spec_bench_heldout_categories(path) == ["c1", "c3"]


def test_length_batches_respect_the_token_budget() -> None:
    prompts = [[1] * n for n in (5, 3000, 40, 900, 10, 1500) * 20]
    batches = length_batches(prompts)
    assert sorted(map(len, (p for b in batches for p in b))) == sorted(map(len, prompts))
    for b in batches:
        assert len(b) <= eagle_data_plan.GEN_BATCH
        assert len(b) == 1 or len(b) * (max(map(len, b)) + eagle_data_plan.GEN_MAX_NEW) <= (
            eagle_data_plan.GEN_TOKEN_BUDGET
        )


def test_shard_round_trip_and_pairing(tmp_path) -> None:
    seqs = [([5, 6, 7, 8], torch.randn(4, 32), 2), ([9, 10, 11], torch.randn(3, 32), 0)]
    Shard.build(seqs).save(tmp_path / "00000-gen.safetensors")
    shard = ShardPool(tmp_path, {}).get("00000-gen.safetensors")
    ids, hidden, start = shard.sequence(0)
    assert ids.tolist() == [5, 6, 7, 8] and start == 2 and hidden.dtype == torch.bfloat16
    embed = torch.arange(12 * 32, dtype=torch.float32).view(12, 32)
    embeds, h_in, positions, h_next = sequence_inputs(ids, hidden, embed)
    # position t pairs embed(token t+1) with hidden t; its target is hidden t+1
    assert torch.equal(embeds[0, 0], embed[6]) and torch.equal(h_in[0, 2], hidden[2])
    assert torch.equal(h_next[0], hidden[1]) and positions.tolist() == [0, 1, 2]


def test_selection_keeps_generated_positions() -> None:
    rng = random.Random(0)
    chosen = training_selection(200, 150, 512, rng)
    assert chosen[generated_positions(200, 150)].all()
    assert 0 < chosen[:149].sum() < 60  # a sample of the prompt
    assert training_selection(2000, 0, 300, rng).sum() == 300


def test_a_few_steps_fit_a_tiny_target() -> None:
    torch.manual_seed(0)
    head = torch.randn(SHAPE.vocab_size, SHAPE.hidden_size)
    embed = torch.randn(SHAPE.vocab_size, SHAPE.hidden_size)
    model = init_draft(SHAPE)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids = torch.randint(0, SHAPE.vocab_size, (40,))
    # "target hidden" that predicts token t+1 from token t: next distribution is learnable
    hidden = embed[torch.roll(ids, -1)] * 2
    select = torch.ones(39, dtype=torch.bool)
    losses = []
    for _ in range(30):
        loss, hits, counts = draft_losses(model, ids, hidden, embed, head, 2, 0.5, select)
        opt.zero_grad()
        (loss / 39).backward()
        opt.step()
        losses.append(float(loss.detach()))
        assert counts == [39, 38]
    assert losses[-1] < 0.5 * losses[0]


def test_pool_prefers_the_least_used_shards(tmp_path) -> None:
    for name in ("00000-gen", "00001-gen"):
        Shard.build([(list(range(10)), torch.randn(10, 8), 3)] * 10).save(
            tmp_path / f"{name}.safetensors"
        )
    uses = {"00000-gen.safetensors": 400.0}  # 4 epochs over its 100 tokens
    pool = ShardPool(tmp_path, uses)
    assert pool.weights() == [100 / 25, 100.0]
    rng = random.Random(0)
    picks = [pool.sample(rng) for _ in range(200)]
    assert len(picks) == 200 and uses["00001-gen.safetensors"] > 1000  # mostly the fresh one
    assert uses is pool.uses  # the checkpointed dict is updated in place


def test_estimated_uses_favour_early_shards() -> None:
    est = estimated_uses(["a", "b", "c"], 300.0)
    assert est["a"] > est["b"] > est["c"] > 0
    assert abs(sum(est.values()) - 300.0) < 1e-9


def test_copy_rule_predicts_the_successor_of_the_last_earlier_occurrence() -> None:
    #        0  1  2  3  4  5  6
    ids = torch.tensor([5, 7, 9, 5, 8, 5, 7])
    # position t: current token ids[t+1]; guess = successor of its last occurrence before t+1
    # t=0 cur 7: new; t=1 cur 9: new; t=2 cur 5: ids[0]=5 -> 7; t=3 cur 8: new;
    # t=4 cur 5: last 5 before index 5 is index 3 -> 8; t=5 cur 7: index 1 -> 9
    assert copy_rule_guesses(ids).tolist() == [-1, -1, 7, -1, 8, 9]
