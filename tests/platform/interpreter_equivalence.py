"""The CPU kernels of `sgl_adaspec.adapters.platform.cpu` (`tree_build`, `tree_verify`,
`cache_slots`: "ops" below) vs SGLang's own Triton kernels, run by the Triton interpreter.

Every ops function claims to compute exactly what the SGLang kernel it stands in for computes.
This script checks that claim bit for bit (torch.equal on every output tensor) over many
seeded random cases whose inputs are produced the way SGLang produces them:

- the draft tree comes from SGLang's own `select_top_k_tokens`, driven for `steps` steps with
  random (sorted top-k) draft probabilities, then `organize_draft_results`;
- tree masks are initialised to True as `eagle_utils.build_tree_kernel_efficient` does (some
  FULL_MASK cases use a random prefix, as its `fill_prefix_mask=False` path leaves torch.empty
  memory there, and some an over-sized preallocated buffer), retrieve_* to -1;
- greedy verification gets the draft tokens with the bonus token in column 0 and a target
  that follows a random root path for a random number of levels, then diverges; accept_index
  [bs, steps+1] starts at -1, predicts [bs*ntok] at 0, as in `eagle_utils.eagle_sample`;
- the cache-location kernels are called as SGLang's `*_func` wrappers call them on a GPU.

It must be started with TRITON_INTERPRET=1 already in the environment (Triton reads it at
import), e.g.

    TRITON_INTERPRET=1 .venv/bin/python tests/platform/interpreter_equivalence.py --cases 60

Exit status 0 when every case matches; 1 on the first mismatch (or, with --keep-going, after
all cases), printing the case's parameters, inputs and a per-element diff. `--only I` reruns
case I of the same --seed alone.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import traceback
from dataclasses import dataclass, field

if os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("interpreter_equivalence.py needs TRITON_INTERPRET=1 set before it starts")
# `_select_top_k_tokens_later` is wrapped in torch.compile; run it eagerly (same math, and an
# inductor compile would dominate the run on a small CPU).
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import torch  # noqa: E402
from sglang.kernels.ops.speculative import cache_locs, eagle  # noqa: E402
from sglang.kernels.ops.speculative.gather_spec_extras import (  # noqa: E402
    gather_spec_extras as sgl_gather_spec_extras,
)
from sglang.kernels.ops.speculative.spec_tree import (  # noqa: E402
    TreeMaskMode,
    sgl_build_tree_kernel_triton,
    verify_tree_greedy_triton,
)
from sglang.srt.mem_cache import allocation  # noqa: E402
from sglang.srt.speculative.eagle_utils import organize_draft_results  # noqa: E402
from sglang.srt.speculative.spec_utils import select_top_k_tokens  # noqa: E402
from sglang.srt.utils import fast_topk, next_power_of_2  # noqa: E402

from sgl_adaspec.adapters.platform.cpu import cache_slots, tree_build, tree_verify  # noqa: E402

VOCAB = 48
HIDDEN = 4
MODES = (TreeMaskMode.FULL_MASK, TreeMaskMode.QLEN_ONLY)


class Mismatch(Exception):
    pass


@dataclass
class Case:
    index: int
    seed: int
    bs: int
    topk: int
    steps: int
    ntok: int
    mode: TreeMaskMode
    seq_lens: list[int]
    sharpness: float  # logit scale of the draft distributions (large = peaked, ties)
    mask_init: str  # "true" | "random" (FULL_MASK prefix left as torch.empty would)
    mask_slack: int  # extra tail elements in a preallocated mask buffer
    inputs: dict = field(default_factory=dict)

    def header(self) -> str:
        return (
            f"case {self.index} (seed {self.seed}): bs={self.bs} topk={self.topk} "
            f"steps={self.steps} ntok={self.ntok} mode={self.mode.name} "
            f"seq_lens={self.seq_lens} sharpness={self.sharpness} "
            f"mask_init={self.mask_init} mask_slack={self.mask_slack}"
        )


def max_draft_tokens(topk: int, steps: int) -> int:
    """Root + every scored node: topk at step 0, topk*topk at each later step."""
    return 1 + topk + (steps - 1) * topk * topk


# --------------------------------------------------------------------------- case generation


def random_case(index: int, base_seed: int, rng: random.Random) -> Case:
    topk = rng.choice((1, 2, 3, 4))
    steps = rng.randint(1, 5)
    limit = max_draft_tokens(topk, steps)
    # The interpreter's cost grows ~ntok^2 * depth; favour small trees, still reach the max.
    roll = rng.random()
    if roll < 0.15:
        ntok = limit
    elif roll < 0.75:
        ntok = rng.randint(2, min(limit, 10))
    else:
        ntok = rng.randint(2, min(limit, 32))
    bs = rng.randint(1, 5) if ntok <= 24 else rng.randint(1, 2)
    return _finish_case(index, base_seed, rng, bs, topk, steps, ntok)


def grid_cases(base_seed: int) -> list[tuple[int, int, int]]:
    """Every (topk, steps) at its maximal tree and at ntok=2."""
    out = []
    for topk in (1, 2, 3, 4):
        for steps in range(1, 6):
            out.append((topk, steps, max_draft_tokens(topk, steps)))
            out.append((topk, steps, 2))
    return out


def _finish_case(index, base_seed, rng, bs, topk, steps, ntok) -> Case:
    mode = rng.choice(MODES)
    seq_lens = [rng.choice((1, 2, 3, rng.randint(4, 40), rng.randint(41, 300))) for _ in range(bs)]
    sharpness = rng.choice((0.5, 2.0, 4.0, 8.0, 40.0))
    mask_init = "random" if mode == TreeMaskMode.FULL_MASK and rng.random() < 0.3 else "true"
    mask_slack = rng.choice((0, 0, 0, 7, 64))
    return Case(
        index=index,
        seed=base_seed * 1_000_003 + index,
        bs=bs,
        topk=topk,
        steps=steps,
        ntok=ntok,
        mode=mode,
        seq_lens=seq_lens,
        sharpness=sharpness,
        mask_init=mask_init,
        mask_slack=mask_slack,
    )


def build_cases(n: int, base_seed: int) -> list[Case]:
    rng = random.Random(base_seed)
    cases = []
    for topk, steps, ntok in grid_cases(base_seed):
        bs = rng.randint(1, 2) if ntok > 24 else rng.randint(1, 5)
        cases.append(_finish_case(len(cases), base_seed, rng, bs, topk, steps, ntok))
    while len(cases) < n:
        cases.append(random_case(len(cases), base_seed, rng))
    return cases


def draft_tree(case: Case, gen: torch.Generator):
    """SGLang's draft loop (`EagleWorkerV2.draft_forward`) on random draft distributions."""
    bs, topk = case.bs, case.topk

    def draft_topk(rows: int):
        logits = torch.randn(rows, VOCAB, generator=gen) * case.sharpness
        probs = torch.softmax(logits, dim=-1)
        return fast_topk(probs, topk, dim=-1)  # sorted descending per node

    topk_p, topk_index = draft_topk(bs)  # from the target's extend / verify pass
    hidden_states = torch.randn(bs, HIDDEN, generator=gen)
    scores = None
    score_list, token_list, parents_list = [], [], []
    for i in range(case.steps):
        _input_ids, hidden_states, scores, tree_info = select_top_k_tokens(
            i, topk_p, topk_index, hidden_states, scores, topk
        )
        score_list.append(tree_info[0])
        token_list.append(tree_info[1])
        parents_list.append(tree_info[2])
        if i == case.steps - 1:
            break
        topk_p, topk_index = draft_topk(bs * topk)
    parent_list, top_scores_index, draft_tokens = organize_draft_results(
        score_list, token_list, parents_list, case.ntok
    )
    bonus = torch.randint(0, VOCAB, (bs,), generator=gen)
    return parent_list, top_scores_index, draft_tokens, bonus


# --------------------------------------------------------------------------- comparison


def _fmt_index(flat: int, shape) -> tuple:
    idx = []
    for dim in reversed(shape):
        idx.append(flat % dim)
        flat //= dim
    return tuple(reversed(idx))


def compare(name: str, got: torch.Tensor, want: torch.Tensor, case: Case, extra: str = ""):
    if got.shape == want.shape and got.dtype == want.dtype and torch.equal(got, want):
        return
    lines = [f"MISMATCH in {name}", case.header()]
    if extra:
        lines.append(extra)
    lines.append(f"  ops:    shape={tuple(got.shape)} dtype={got.dtype}")
    lines.append(f"  triton: shape={tuple(want.shape)} dtype={want.dtype}")
    if got.shape == want.shape:
        diff = (got.long() != want.long()).reshape(-1).nonzero().flatten().tolist()
        lines.append(f"  {len(diff)} differing element(s); first ones (index: ops vs triton):")
        g, w = got.reshape(-1).tolist(), want.reshape(-1).tolist()
        for flat in diff[:20]:
            lines.append(f"    {_fmt_index(flat, tuple(got.shape))}: {g[flat]} vs {w[flat]}")
        if got.numel() <= 400:
            lines.append(f"  ops    = {got.tolist()}")
            lines.append(f"  triton = {want.tolist()}")
    for key, value in case.inputs.items():
        lines.append(f"  input {key} = {value.tolist() if torch.is_tensor(value) else value}")
    raise Mismatch("\n".join(lines))


def mask_blocks(mask: torch.Tensor, case: Case) -> str:
    """The per-request tree part of a mask as 0/1 rows, for diffs."""
    ntok, out, start = case.ntok, [], 0
    for b in range(case.bs):
        prefix = case.seq_lens[b] if case.mode == TreeMaskMode.FULL_MASK else 0
        row = prefix + ntok
        block = mask[start : start + ntok * row].view(ntok, row)[:, prefix:]
        out.append(f"    req {b}: " + " ".join("".join(str(int(v)) for v in r) for r in block))
        start += ntok * row
    return "\n".join(out)


def run_ops(name: str, fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception:  # an ops crash where the kernel succeeds is a mismatch too
        raise Mismatch(f"ops.{name} RAISED:\n{traceback.format_exc()}") from None


# --------------------------------------------------------------------------- the checks


def check_tree(case: Case, gen: torch.Generator):
    parent_list, top_scores_index, draft_tokens, bonus = draft_tree(case, gen)
    bs, ntok, topk, steps = case.bs, case.ntok, case.topk, case.steps
    seq_lens = torch.tensor(case.seq_lens, dtype=torch.int64)
    case.inputs.update(
        parent_list=parent_list, top_scores_index=top_scores_index, seq_lens=seq_lens
    )

    if case.mode == TreeMaskMode.FULL_MASK:
        size = int(seq_lens.sum()) * ntok + ntok * ntok * bs
    else:
        size = ntok * bs * ntok
    size += case.mask_slack
    if case.mask_init == "random":
        mask0 = torch.randint(0, 2, (size,), generator=gen).bool()
    else:
        mask0 = torch.full((size,), True, dtype=torch.bool)

    outs = {}
    for who in ("ops", "triton"):
        tree_mask = mask0.clone()
        retrieve = torch.full((3, bs, ntok), -1, dtype=torch.long)
        positions = torch.full((bs * ntok,), -77, dtype=torch.long)  # torch.empty in SGLang
        args = (
            parent_list,
            top_scores_index,
            seq_lens,
            tree_mask,
            positions,
            retrieve[0],
            retrieve[1],
            retrieve[2],
            topk,
            steps,
            ntok,
            case.mode,
        )
        if who == "ops":
            run_ops("build_tree_kernel_efficient", tree_build.build_tree_kernel_efficient, *args)
        else:
            sgl_build_tree_kernel_triton(*args)
        outs[who] = dict(
            tree_mask=tree_mask,
            positions=positions,
            retrieve_index=retrieve[0],
            retrieve_next_token=retrieve[1],
            retrieve_next_sibling=retrieve[2],
        )
    o, t = outs["ops"], outs["triton"]
    for key in ("retrieve_index", "retrieve_next_token", "retrieve_next_sibling", "positions"):
        compare(f"build_tree_kernel_efficient/{key}", o[key], t[key], case)
    if not torch.equal(o["tree_mask"], t["tree_mask"]):
        extra = ""
        if o["tree_mask"].shape == t["tree_mask"].shape:
            extra = (
                "  tree part of each mask row (ops):\n"
                + mask_blocks(o["tree_mask"], case)
                + "\n  (triton):\n"
                + mask_blocks(t["tree_mask"], case)
            )
        compare(
            "build_tree_kernel_efficient/tree_mask", o["tree_mask"], t["tree_mask"], case, extra
        )

    candidates = torch.cat((bonus.unsqueeze(1), draft_tokens), dim=1)  # [bs, ntok]
    return candidates, t


def tree_children(next_token: list[int], next_sibling: list[int], node: int) -> list[int]:
    out, child = [], next_token[node]
    while child != -1:
        out.append(child)
        child = next_sibling[child]
    return out


def make_target(case: Case, candidates, tree, rng: random.Random, gen: torch.Generator):
    """Target argmax that follows a random root path for a random number of levels, then
    diverges (a token none of that node's children carries)."""
    bs, ntok = case.bs, case.ntok
    target = torch.randint(0, VOCAB, (bs, ntok), generator=gen)
    cand = candidates.tolist()
    planned = []
    for b in range(bs):
        nxt = tree["retrieve_next_token"][b].tolist()
        sib = tree["retrieve_next_sibling"][b].tolist()
        path = [0]
        while True:
            kids = tree_children(nxt, sib, path[-1])
            if not kids:
                break
            path.append(rng.choice(kids))
        accept = rng.randint(0, len(path) - 1)
        for level in range(accept):
            target[b, path[level]] = cand[b][path[level + 1]]
        stop = path[accept]
        kid_tokens = {cand[b][k] for k in tree_children(nxt, sib, stop)}
        free = [v for v in range(VOCAB) if v not in kid_tokens]
        target[b, stop] = rng.choice(free)
        planned.append(accept)
    return target, planned


def check_verify(case: Case, candidates, tree, rng, gen):
    bs, ntok, steps = case.bs, case.ntok, case.steps
    target_predict, planned = make_target(case, candidates, tree, rng, gen)
    case.inputs.update(candidates=candidates, target_predict=target_predict)
    for key in ("retrieve_index", "retrieve_next_token", "retrieve_next_sibling"):
        case.inputs[key] = tree[key]
    outs = {}
    for who in ("ops", "triton"):
        predicts = torch.zeros((bs * ntok,), dtype=torch.int32)
        accept_index = torch.full((bs, steps + 1), -1, dtype=torch.int32)
        accept_token_num = torch.full((bs,), -55, dtype=torch.int32)  # torch.empty in SGLang
        args = (
            predicts,
            accept_index,
            accept_token_num,
            candidates,
            tree["retrieve_index"],
            tree["retrieve_next_token"],
            tree["retrieve_next_sibling"],
            target_predict,
        )
        if who == "ops":
            run_ops("verify_tree_greedy", tree_verify.verify_tree_greedy, *args)
        else:
            verify_tree_greedy_triton(*args)
        outs[who] = dict(
            predicts=predicts, accept_index=accept_index, accept_token_num=accept_token_num
        )
    o, t = outs["ops"], outs["triton"]
    for key in ("accept_token_num", "accept_index", "predicts"):
        compare(f"verify_tree_greedy/{key}", o[key], t[key], case)
    # Harness sanity: the planned accept lengths are what the kernel accepted.
    if t["accept_token_num"].tolist() != planned:
        raise RuntimeError(
            f"harness bug: planned accept lengths {planned}, kernel accepted "
            f"{t['accept_token_num'].tolist()}\n{case.header()}"
        )
    return t, planned


def check_accept_ops(case: Case, verify_out, gen):
    """fill_front_out_cache_loc / fill_accept_out_cache_loc / fill_bonus_tokens, fed as
    `spec_utils.move_accept_tokens_to_target_kvcache` and the verify commit feed them."""
    bs, ntok = case.bs, case.ntok
    accept_index = verify_out["accept_index"]
    num_correct = verify_out["accept_token_num"]
    predict = verify_out["predicts"]
    size = bs * accept_index.shape[1]
    out_cache_loc = torch.randperm(4 * bs * ntok + 16, generator=gen)[: bs * ntok].to(torch.int64)
    case.inputs.update(accept_index=accept_index, out_cache_loc=out_cache_loc)

    # fill_front_out_cache_loc_func(num_correct_drafts + 1, batch.out_cache_loc, tgt_cache_loc)
    num_front = num_correct + 1
    got = torch.zeros(size, dtype=torch.int64)
    want = torch.zeros(size, dtype=torch.int64)
    run_ops(
        "fill_front_out_cache_loc", cache_slots.fill_front_out_cache_loc,
        num_front, out_cache_loc, got,
    )
    window = out_cache_loc.view(bs, -1)
    rows = torch.arange(bs, device=window.device)
    starts = torch.zeros_like(num_front)
    cache_locs.assign_extend_cache_locs[(bs,)](
        rows, window, starts, num_front, want, window.shape[1], next_power_of_2(bs)
    )
    compare("fill_front_out_cache_loc/front_out_cache_loc", got, want, case)

    # fill_accept_out_cache_loc_func(accept_index, batch.out_cache_loc, accept_out_cache_loc, size)
    got = torch.zeros(size, dtype=torch.int64)
    want = torch.zeros(size, dtype=torch.int64)
    run_ops(
        "fill_accept_out_cache_loc", cache_slots.fill_accept_out_cache_loc,
        accept_index, out_cache_loc, got, size,
    )
    eagle.fill_accept_out_cache_loc[(size,)](
        accept_index, out_cache_loc, want, next_power_of_2(size)
    )
    compare("fill_accept_out_cache_loc/accept_out_cache_loc", got, want, case)

    # accept_tokens = predict[accept_index]; fill_bonus_tokens_func(accept_tokens, accept_lens,
    #     bonus_tokens, accept_index.shape[1], bs)
    accept_tokens = predict[accept_index]
    accept_lens = num_correct + 1
    got = torch.full((bs,), -9, dtype=torch.int32)  # torch.empty_like in SGLang
    want = got.clone()
    run_ops(
        "fill_bonus_tokens", cache_slots.fill_bonus_tokens,
        accept_tokens, accept_lens, got, accept_index.shape[1], bs,
    )
    eagle.fill_bonus_tokens[(bs,)](accept_tokens, accept_lens, want, accept_index.shape[1])
    compare("fill_bonus_tokens/bonus_tokens", got, want, case)


def check_pool_ops(case: Case, rng: random.Random, gen: torch.Generator):
    """assign_draft_cache_locs_contiguous / assign_extend_cache_locs / assign_req_to_token_pool
    on a req_to_token table (int32, as ReqToTokenPool allocates it)."""
    bs, topk, steps, ntok = case.bs, case.topk, case.steps, case.ntok
    seq_lens = torch.tensor(case.seq_lens, dtype=torch.int64)
    pool_rows = bs + rng.randint(0, 3)
    width = max(case.seq_lens) + topk * max(steps, ntok) + ntok + rng.randint(0, 40)
    req_to_token = torch.randint(0, 1 << 20, (pool_rows, width), generator=gen).to(torch.int32)
    req_pool_indices = torch.randperm(pool_rows, generator=gen)[:bs].to(torch.int64)
    case.inputs.update(req_pool_indices=req_pool_indices)

    # assign_draft_cache_locs_contiguous_func(req_pool_indices, req_to_token, seq_lens,
    #     out_cache_loc, topk, window_cols, positions=...): window_cols = steps or ntok.
    for num_cols in sorted({steps, ntok}):
        for with_positions in (False, True):
            n_out = bs * topk * num_cols
            got = torch.full((n_out,), -3, dtype=torch.int64)
            want = got.clone()
            pos_got = torch.full((bs * topk,), -4, dtype=torch.int64) if with_positions else None
            pos_want = pos_got.clone() if with_positions else None
            run_ops(
                "assign_draft_cache_locs_contiguous",
                cache_slots.assign_draft_cache_locs_contiguous,
                req_pool_indices, req_to_token, seq_lens, got, topk, num_cols,
                positions=pos_got, mrope=None,
            )
            cache_locs.assign_draft_cache_locs_contiguous[(bs,)](
                req_pool_indices, req_to_token, seq_lens, want,
                req_to_token.shape[1], topk, num_cols,
                positions=pos_want, mrope=None, BS=bs,
                WRITE_POSITIONS=with_positions, WRITE_MROPE=False,
            )
            tag = f"num_cols={num_cols} positions={with_positions}"
            compare(f"assign_draft_cache_locs_contiguous/out_cache_loc [{tag}]", got, want, case)
            if with_positions:
                compare(
                    f"assign_draft_cache_locs_contiguous/positions [{tag}]",
                    pos_got, pos_want, case,
                )

    # assign_extend_cache_locs_func(req_pool_indices, req_to_token, seq_lens,
    #     seq_lens + ntok, bs, ntok, device): uniform rows (the verify window).
    start = seq_lens
    end = seq_lens + ntok
    got = run_ops(
        "assign_extend_cache_locs", cache_slots.assign_extend_cache_locs,
        req_pool_indices, req_to_token, start, end, bs, ntok, "cpu",
    )
    want = torch.empty((bs * ntok,), dtype=torch.int64)
    cache_locs.assign_extend_cache_locs[(bs,)](
        req_pool_indices, req_to_token, start, end, want,
        req_to_token.shape[1], next_power_of_2(bs),
    )
    compare("assign_extend_cache_locs [uniform]", got, want, case)
    # Ragged rows (end - start <= ntok): both pack from the front and leave the tail as
    # torch.empty memory, so only the packed prefix is an output.
    lengths = torch.tensor([rng.randint(0, ntok) for _ in range(bs)], dtype=torch.int64)
    end = start + lengths
    packed = int(lengths.sum())
    got = run_ops(
        "assign_extend_cache_locs", cache_slots.assign_extend_cache_locs,
        req_pool_indices, req_to_token, start, end, bs, ntok, "cpu",
    )
    want = torch.empty((bs * ntok,), dtype=torch.int64)
    cache_locs.assign_extend_cache_locs[(bs,)](
        req_pool_indices, req_to_token, start, end, want,
        req_to_token.shape[1], next_power_of_2(bs),
    )
    compare(
        f"assign_extend_cache_locs [ragged lengths={lengths.tolist()}] packed prefix",
        got[:packed], want[:packed], case,
    )

    # assign_req_to_token_pool_func(req_pool_indices, req_to_token, cur_kv_lens, nxt_kv_lens,
    #     out_cache_loc (int64, packed), len(reqs)); lengths vary per request.
    grow = torch.tensor(
        [rng.randint(0, topk * steps + ntok) for _ in range(bs)], dtype=torch.int64
    )
    cur, nxt = seq_lens, seq_lens + grow
    out_cache_loc = torch.randint(0, 1 << 20, (int(grow.sum()),), generator=gen)
    got_table, want_table = req_to_token.clone(), req_to_token.clone()
    run_ops(
        "assign_req_to_token_pool", cache_slots.assign_req_to_token_pool,
        req_pool_indices, got_table, cur, nxt, out_cache_loc, bs,
    )
    allocation.assign_req_to_token_pool[(bs,)](
        req_pool_indices, want_table, cur, nxt, out_cache_loc,
        want_table.shape[1], next_power_of_2(bs),
    )
    compare(
        f"assign_req_to_token_pool/req_to_token [grow={grow.tolist()}]",
        got_table, want_table, case,
    )


def check_gather_spec_extras(case: Case, rng: random.Random, gen: torch.Generator):
    """gather_spec_extras: the overlap schedule's read of rows of the previous iteration's
    draft state (topk_p float32, topk_index int64, bonus tokens int64, hidden states, optional),
    in buffers of more rows than requests, at a random index order with repeats."""
    bs, topk = case.bs, case.topk
    rows, hidden = bs + rng.randint(0, 4), rng.randint(1, 24)
    topk_p = torch.rand((rows, topk), generator=gen)
    topk_index = torch.randint(0, VOCAB, (rows, topk), generator=gen)
    bonus = torch.randint(0, VOCAB, (rows,), generator=gen)
    states = torch.randn((rows, hidden), generator=gen) if rng.random() < 0.5 else None
    indices = torch.randint(0, rows, (bs,), generator=gen)
    case.inputs.update(gather_indices=indices)
    got = run_ops(
        "gather_spec_extras", cache_slots.gather_spec_extras,
        indices, topk_p, topk_index, bonus, states,
    )
    want = sgl_gather_spec_extras(indices, topk_p, topk_index, bonus, states)
    for name, g, w in zip(("topk_p", "topk_index", "bonus_tokens", "hidden_states"), got, want):
        if w is None:
            assert g is None, name
            continue
        compare(f"gather_spec_extras/{name}", g, w, case)


def run_case(case: Case) -> dict:
    rng = random.Random(case.seed)
    gen = torch.Generator().manual_seed(case.seed)
    candidates, tree = check_tree(case, gen)
    verify_out, planned = check_verify(case, candidates, tree, rng, gen)
    check_accept_ops(case, verify_out, gen)
    check_pool_ops(case, rng, gen)
    check_gather_spec_extras(case, rng, gen)
    return {"accepted": planned}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=80, help="number of cases (>= 40 "
                        "covers every (topk, steps) at ntok=2 and at its maximal tree)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", type=int, default=None, help="run just this case index")
    parser.add_argument("--keep-going", action="store_true",
                        help="report every mismatching case instead of stopping at the first")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)

    cases = build_cases(max(args.cases, (args.only or 0) + 1), args.seed)
    if args.only is not None:
        cases = [cases[args.only]]
    else:
        cases = cases[: args.cases]

    t0 = time.time()
    failed = []
    ran = 0
    accept_hist: dict[int, int] = {}
    for case in cases:
        t = time.time()
        ran += 1
        try:
            info = run_case(case)
        except Mismatch as exc:
            print(str(exc) if str(exc).startswith("MISMATCH") else f"{case.header()}\n{exc}")
            print(f"  reproduce: TRITON_INTERPRET=1 python {sys.argv[0]} "
                  f"--seed {args.seed} --only {case.index}\n", flush=True)
            failed.append(case.index)
            if not args.keep_going:
                break
            continue
        for n in info["accepted"]:
            accept_hist[n] = accept_hist.get(n, 0) + 1
        if args.verbose:
            print(f"ok {time.time() - t:6.2f}s  {case.header()}", flush=True)

    elapsed = time.time() - t0
    if failed:
        print(f"FAILED: {len(failed)} of {ran} cases mismatched (cases {failed}); {elapsed:.1f}s")
        return 1
    hist = ", ".join(f"{k}:{v}" for k, v in sorted(accept_hist.items()))
    print(f"{len(cases)} cases passed in {elapsed:.1f}s (seed {args.seed}; "
          f"accepted-drafts histogram {{{hist}}})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
