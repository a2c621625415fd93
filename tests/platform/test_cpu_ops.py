"""The pure-torch speculative ops (`sgl_adaspec.adapters.platform.cpu`: `tree_build`,
`tree_verify`, `cache_slots`).

- `test_ops_match_triton_kernels_under_interpreter`: the ops against SGLang's own Triton kernels,
  bit for bit, over seeded random SGLang-produced drafts (`interpreter_equivalence.py`, run in a
  subprocess because TRITON_INTERPRET must be set before Triton is imported).
- the rest: tiny hand-built trees and tables with hand-computed outputs, no Triton involved.

No `__init__.py` in this directory on purpose: as a package it would be named `platform` and
collide with the standard library module of that name under pytest's default import mode.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from sglang.kernels.ops.speculative.spec_tree import TreeMaskMode

from sgl_adaspec.adapters.platform.cpu import cache_slots, tree_build, tree_verify

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SCRIPT = HERE / "interpreter_equivalence.py"
# ~0.3 s per case under the interpreter on a small CPU, plus ~6 s of imports; the first 40 cases
# are every (topk, steps) at ntok=2 and at the maximal tree, the rest random.
INTERPRETER_CASES = 100


@pytest.mark.slow  # ~35 s on 2 cores
def test_ops_match_triton_kernels_under_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", TORCHDYNAMO_DISABLE="1")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--cases", str(INTERPRETER_CASES), "--keep-going"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = "\n".join(
        line for line in proc.stdout.splitlines() if "UserWarning" not in line
    )
    assert proc.returncode == 0, (
        f"ops differ from SGLang's Triton kernels (exit {proc.returncode}):\n"
        f"{report[-12000:]}\n--- stderr tail ---\n{proc.stderr[-3000:]}"
    )
    assert f"{INTERPRETER_CASES} cases passed" in proc.stdout, report


# --------------------------------------------------------------------------- tree building
#
# bs=1, topk=2, steps=2: the root's two children a (score 0) and b (score 1); at step 1 node a
# (expansion slot 1) has children at score indices 2, 3 and b (slot 2) at 4, 5. Selecting score
# indices [0, 1, 2] gives nodes 1=a, 2=b, 3=c with c the first child of a:
#
#     root(0) -> a(1) -> c(3)
#             -> b(2)
#
# parent_list (= cat(parents_list[:-1]) of `select_top_k_tokens`) = [-1, 0, 1]: slot 0 is the
# root, slot 1 expands score index 0 (a), slot 2 expands score index 1 (b).

TOPK, STEPS, NTOK = 2, 2, 4
PARENT_LIST = [-1, 0, 1]
SELECTED = [0, 1, 2]
# node i attends to j (tree part of the mask): the root, itself, its ancestors
TREE_MASK = [
    [1, 0, 0, 0],
    [1, 1, 0, 0],
    [1, 0, 1, 0],
    [1, 1, 0, 1],
]
DEPTHS = [0, 1, 1, 2]
NEXT_TOKEN = [1, 3, -1, -1]
NEXT_SIBLING = [-1, 2, -1, -1]


def _build(seq_lens, mode, mask, parent_list=None, selected=None, topk=TOPK, steps=STEPS,
           ntok=NTOK):
    bs = len(seq_lens)
    if parent_list is None:
        parent_list = [PARENT_LIST] * bs
    parent_list = torch.tensor(parent_list, dtype=torch.long)  # [bs, P], P may be 0
    selected = torch.tensor(selected if selected is not None else [SELECTED] * bs)
    retrieve = torch.full((3, bs, ntok), -1, dtype=torch.long)
    positions = torch.full((bs * ntok,), -1, dtype=torch.long)
    tree_build.build_tree_kernel_efficient(
        parent_list,
        selected,
        torch.tensor(seq_lens, dtype=torch.long),
        mask,
        positions,
        retrieve[0],
        retrieve[1],
        retrieve[2],
        topk,
        steps,
        ntok,
        mode,
    )
    return positions, retrieve


def test_build_tree_qlen_only():
    mask = torch.full((NTOK * NTOK,), True)
    positions, (r_index, r_next, r_sib) = _build([7], TreeMaskMode.QLEN_ONLY, mask)
    assert positions.tolist() == [7 + d for d in DEPTHS]
    assert r_index.tolist() == [[0, 1, 2, 3]]
    assert r_next.tolist() == [NEXT_TOKEN]
    assert r_sib.tolist() == [NEXT_SIBLING]
    assert mask.view(NTOK, NTOK).int().tolist() == TREE_MASK


def test_build_tree_full_mask_two_requests_leaves_prefix_alone():
    # Two requests with prefixes 3 and 1: request b's block is [ntok, seq_len + ntok] rows,
    # starting after the blocks before it. The prefix columns are the caller's (here False,
    # so a stray write would show); every tree cell is written.
    seq_lens = [3, 1]
    size = sum(seq_lens) * NTOK + NTOK * NTOK * len(seq_lens)
    mask = torch.zeros(size + 5, dtype=torch.bool)  # + an over-sized buffer's tail
    positions, (r_index, r_next, r_sib) = _build(seq_lens, TreeMaskMode.FULL_MASK, mask)
    assert positions.tolist() == [3 + d for d in DEPTHS] + [1 + d for d in DEPTHS]
    assert r_index.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert r_next.tolist() == [NEXT_TOKEN] * 2
    assert r_sib.tolist() == [NEXT_SIBLING] * 2
    first = mask[: NTOK * 7].view(NTOK, 7).int().tolist()
    assert first == [[0, 0, 0] + row for row in TREE_MASK]
    second = mask[NTOK * 7 : NTOK * 7 + NTOK * 5].view(NTOK, 5).int().tolist()
    assert second == [[0] + row for row in TREE_MASK]
    assert not mask[size:].any()


def test_build_tree_single_step_has_no_parent_list():
    # speculative_num_steps=1: `organize_draft_results` returns an empty [bs, 0] parent_list
    # (every selected node is a child of the root). topk=2, ntok=3: root -> x, root -> y.
    mask = torch.full((9,), True)
    positions, (r_index, r_next, r_sib) = _build(
        [5], TreeMaskMode.QLEN_ONLY, mask, parent_list=[[]], selected=[[0, 1]], steps=1, ntok=3
    )
    assert positions.tolist() == [5, 6, 6]
    assert r_index.tolist() == [[0, 1, 2]]
    assert r_next.tolist() == [[1, -1, -1]]
    assert r_sib.tolist() == [[-1, 2, -1]]
    assert mask.view(3, 3).int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 0, 1]]


# --------------------------------------------------------------------------- greedy verify

# Tokens: root (bonus) 10, a 11, b 12, c 13.
CANDIDATES = [10, 11, 12, 13]


def _verify(targets: list[list[int]]):
    bs = len(targets)
    predicts = torch.zeros(bs * NTOK, dtype=torch.int32)
    accept_index = torch.full((bs, STEPS + 1), -1, dtype=torch.int32)
    accept_token_num = torch.full((bs,), -7, dtype=torch.int32)
    tree_verify.verify_tree_greedy(
        predicts,
        accept_index,
        accept_token_num,
        torch.tensor([CANDIDATES] * bs),
        torch.arange(bs * NTOK).view(bs, NTOK),
        torch.tensor([NEXT_TOKEN] * bs),
        torch.tensor([NEXT_SIBLING] * bs),
        torch.tensor(targets),
    )
    return predicts.tolist(), accept_index.tolist(), accept_token_num.tolist()


def test_verify_accepts_two_levels_then_stops():
    # target after root = 11 (a), after a = 13 (c), after c = 99: root -> a -> c, bonus 99.
    predicts, accept_index, num = _verify([[11, 13, 55, 99]])
    assert num == [2]
    assert accept_index == [[0, 1, 3]]
    assert predicts == [11, 13, 0, 99]


def test_verify_accepts_none():
    # target after root = 50: neither a (11) nor b (12); only the bonus token.
    predicts, accept_index, num = _verify([[50, 13, 12, 99]])
    assert num == [0]
    assert accept_index == [[0, -1, -1]]
    assert predicts == [50, 0, 0, 0]


def test_verify_takes_second_sibling_and_offsets_requests():
    # Request 0 matches b (the second child; a leaf): one draft accepted, bonus = target at b.
    # Request 1 follows a -> c: its retrieve indices and predicts are offset by ntok.
    predicts, accept_index, num = _verify([[12, 1, 33, 2], [11, 13, 3, 44]])
    assert num == [1, 2]
    assert accept_index == [[0, 2, -1], [4, 5, 7]]
    assert predicts == [12, 0, 33, 0, 11, 13, 0, 44]


# --------------------------------------------------------------------------- cache locations


def _table() -> torch.Tensor:
    # req_to_token[r, c] = 100 * r + c (int32, as ReqToTokenPool allocates it)
    return (100 * torch.arange(3).view(3, 1) + torch.arange(10)).to(torch.int32)


REQ_POOL_INDICES = torch.tensor([2, 0])
SEQ_LENS = torch.tensor([3, 5])


def test_assign_draft_cache_locs_contiguous():
    out = torch.full((8,), -1, dtype=torch.int64)
    positions = torch.full((4,), -1, dtype=torch.int64)
    cache_slots.assign_draft_cache_locs_contiguous(
        REQ_POOL_INDICES, _table(), SEQ_LENS, out, 2, 2, positions=positions
    )
    assert out.tolist() == [203, 204, 205, 206, 5, 6, 7, 8]
    assert positions.tolist() == [3, 3, 5, 5]


def test_assign_extend_cache_locs_packs_rows_from_the_front():
    out = cache_slots.assign_extend_cache_locs(
        REQ_POOL_INDICES, _table(), SEQ_LENS, torch.tensor([5, 6]), 2, 2, "cpu"
    )
    assert out.dtype == torch.int64 and out.shape == (4,)
    assert out[:3].tolist() == [203, 204, 5]


def test_assign_req_to_token_pool_scatters_into_rows():
    table = _table()
    expected = table.clone()
    expected[2, 3], expected[2, 4], expected[0, 5] = 900, 901, 902
    cache_slots.assign_req_to_token_pool(
        REQ_POOL_INDICES, table, SEQ_LENS, torch.tensor([5, 6]),
        torch.tensor([900, 901, 902]), 2,
    )
    assert torch.equal(table, expected)


def test_fill_front_out_cache_loc():
    out_cache_loc = torch.tensor([10, 11, 12, 20, 21, 22])  # bs=2 windows of 3
    front = torch.zeros(6, dtype=torch.int64)
    cache_slots.fill_front_out_cache_loc(
        torch.tensor([2, 1], dtype=torch.int32), out_cache_loc, front
    )
    assert front.tolist() == [10, 11, 20, 0, 0, 0]


def test_fill_accept_out_cache_loc():
    accept_index = torch.tensor([[0, 1, -1], [3, -1, -1]], dtype=torch.int32)
    out = torch.zeros(6, dtype=torch.int64)
    cache_slots.fill_accept_out_cache_loc(
        accept_index, torch.tensor([10, 11, 12, 20, 21, 22]), out, 6
    )
    assert out.tolist() == [10, 11, 20, 0, 0, 0]


def test_fill_bonus_tokens():
    accept_tokens = torch.tensor([[5, 6, 7], [8, 9, 10]], dtype=torch.int32)
    bonus = torch.full((2,), -1, dtype=torch.int32)
    cache_slots.fill_bonus_tokens(
        accept_tokens, torch.tensor([2, 1], dtype=torch.int32), bonus, 3, 2
    )
    assert bonus.tolist() == [6, 8]


@pytest.mark.parametrize("mode", [TreeMaskMode.QLEN_ONLY_BITPACKING])
def test_build_tree_rejects_bitpacking(mode):
    with pytest.raises(NotImplementedError):
        _build([3], mode, torch.zeros(NTOK, dtype=torch.uint8))


def test_gather_spec_extras_reads_rows_in_index_order():
    topk_p = torch.tensor([[0.5, 0.25], [0.875, 0.125], [0.75, 0.1875]])
    topk_index = torch.tensor([[3, 4], [5, 6], [7, 8]])
    bonus = torch.tensor([10, 11, 12])
    p, index, tokens, hidden = cache_slots.gather_spec_extras(
        torch.tensor([2, 0, 2]), topk_p, topk_index, bonus, None
    )
    assert p.tolist() == [[0.75, 0.1875], [0.5, 0.25], [0.75, 0.1875]]
    assert index.tolist() == [[7, 8], [3, 4], [7, 8]] and tokens.tolist() == [12, 10, 12]
    assert hidden is None
    states = torch.arange(6.0).reshape(3, 2)
    assert cache_slots.gather_spec_extras(torch.tensor([1]), topk_p, topk_index, bonus, states)[
        3
    ].tolist() == [[2.0, 3.0]]
