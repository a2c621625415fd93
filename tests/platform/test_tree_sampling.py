"""Tree verification under sampling (CPU stand-in for sgl-kernel's target-only sampler):
every committed token must be distributed as the target's distribution q, whatever the draft."""

from __future__ import annotations

import torch

from sgl_adaspec.adapters.platform.cpu import tree_verify

# One request, tree: root(0) -> {1: token 3, 2: token 5}, 1 -> {3: token 2}.
CANDIDATES = torch.tensor([[7, 3, 5, 2]])
NEXT_TOKEN = torch.tensor([[1, 3, -1, -1]])
NEXT_SIBLING = torch.tensor([[-1, 2, -1, -1]])
VOCAB = 6


def run(
    target_probs: torch.Tensor,
    trials: int,
    seed: int = 0,
    next_token: torch.Tensor = NEXT_TOKEN,
    next_sibling: torch.Tensor = NEXT_SIBLING,
):
    """Returns (first committed token, second committed token or -1) per trial."""
    gen = torch.Generator().manual_seed(seed)
    firsts, seconds = [], []
    for _ in range(trials):
        predicts = torch.zeros(4, dtype=torch.int32)
        accept_index = torch.full((1, 3), -1, dtype=torch.int32)
        accept_num = torch.zeros(1, dtype=torch.int32)
        tree_verify.tree_speculative_sampling_target_only(
            predicts=predicts,
            accept_index=accept_index,
            accept_token_num=accept_num,
            candidates=CANDIDATES,
            retrive_index=torch.arange(4).view(1, 4),
            retrive_next_token=next_token,
            retrive_next_sibling=next_sibling,
            uniform_samples=torch.rand((1, 4), generator=gen),
            uniform_samples_for_final_sampling=torch.rand((1,), generator=gen),
            target_probs=target_probs,
            draft_probs=torch.zeros_like(target_probs),
        )
        path = accept_index[0, : int(accept_num[0]) + 1].tolist()
        committed = [int(predicts[i]) for i in path]
        firsts.append(committed[0])
        seconds.append(committed[1] if len(committed) > 1 else -1)
    return torch.tensor(firsts), torch.tensor(seconds)


def target() -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    probs = torch.rand((1, 4, VOCAB), generator=gen) ** 2
    return probs / probs.sum(-1, keepdim=True)


def test_first_committed_token_follows_target_distribution():
    q = target()
    trials = 6000
    firsts, _ = run(q, trials)
    empirical = torch.bincount(firsts, minlength=VOCAB).float() / trials
    # 4 standard errors of a binomial proportion, per token.
    tolerance = 4 * torch.sqrt(q[0, 0] * (1 - q[0, 0]) / trials) + 1e-3
    assert torch.all((empirical - q[0, 0]).abs() <= tolerance), (empirical, q[0, 0])


def test_token_after_accepted_draft_follows_its_conditional():
    q = target()
    firsts, seconds = run(q, 6000, seed=2)
    after_three = seconds[firsts == 3]  # node 1 (token 3) accepted: next from q at node 1
    assert after_three.numel() > 300
    empirical = torch.bincount(after_three, minlength=VOCAB).float() / after_three.numel()
    tolerance = 4 * torch.sqrt(q[0, 1] * (1 - q[0, 1]) / after_three.numel()) + 1e-3
    assert torch.all((empirical - q[0, 1]).abs() <= tolerance), (empirical, q[0, 1])


def test_certain_target_accepts_the_whole_path():
    q = torch.zeros((1, 4, VOCAB))
    q[0, 0, 3] = q[0, 1, 2] = q[0, 3, 4] = 1.0  # root->3->2, then bonus 4
    q[0, 2, 0] = 1.0
    firsts, seconds = run(q, 20)
    assert firsts.eq(3).all() and seconds.eq(2).all()


def test_rejected_drafts_are_never_the_bonus_token():
    q = torch.zeros((1, 4, VOCAB))
    q[0, :, :] = 1.0 / VOCAB
    q[0, 0, 3] = q[0, 0, 5] = 0.0  # both root children impossible under the target
    q[0, 0] /= q[0, 0].sum()
    firsts, _ = run(q, 500)
    assert not firsts.eq(3).any() and not firsts.eq(5).any()


def test_pruned_tree_still_follows_target_distribution():
    """adaserve verifies a subtree (unselected nodes unlinked): sampling stays exact."""
    q = target()
    trials = 6000
    # Node 2 (token 5) and node 3 pruned: root -> {1}, 1 -> {}.
    firsts, _ = run(
        q, trials, seed=3,
        next_token=torch.tensor([[1, -1, -1, -1]]),
        next_sibling=torch.tensor([[-1, -1, -1, -1]]),
    )  # fmt: skip
    empirical = torch.bincount(firsts, minlength=VOCAB).float() / trials
    tolerance = 4 * torch.sqrt(q[0, 0] * (1 - q[0, 0]) / trials) + 1e-3
    assert torch.all((empirical - q[0, 0]).abs() <= tolerance), (empirical, q[0, 0])
