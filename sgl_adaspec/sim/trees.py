"""Sampled draft trees (beam search over synthetic draft probabilities) and the accept walk.

Dims: B requests, d levels (depth), w beam width, N = d * w candidate nodes per request, laid out
level by level (nodes [l*w, (l+1)*w) are at depth l + 1), so a parent always precedes its
children, as `Candidates` requires.

Beam search (AdaServe 4.1 / SGLang's EAGLE topk): step 1 expands the root into its top-w
children; each later step expands the w frontier nodes into w children each and keeps, per
request, the w of those w * w children with the highest path probability f.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from sgl_adaspec.sim.acceptance import AcceptanceModel
from sgl_adaspec.speculative.candidates import Candidates


@dataclass(frozen=True)
class SampledTrees:
    """- parents [B, N] int64 (-1 = child of the root), path_prob [B, N] float64 (f);
    - accept_prob [B, N] float64: P(target emits this node's token | its parent accepted);
    - depth, width: the beam's shape (N = depth * width)."""

    parents: np.ndarray
    path_prob: np.ndarray
    accept_prob: np.ndarray
    depth: int
    width: int

    @property
    def num_requests(self) -> int:
        return self.parents.shape[0]

    def candidates(self) -> Candidates:
        num_requests, num_nodes = self.parents.shape
        return Candidates.of_beam(
            tokens=torch.arange(num_nodes, dtype=torch.int64).expand(num_requests, num_nodes),
            parents=torch.from_numpy(self.parents),
            path_prob=torch.from_numpy(self.path_prob),
            valid=torch.ones((num_requests, num_nodes), dtype=torch.bool),
            depth=self.depth,
            width=self.width,
        )


def _children(
    model: AcceptanceModel,
    rng: np.random.Generator,
    alpha: np.ndarray,
    beta: np.ndarray,
    frontier: tuple[int, int],
    width: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Draft probabilities p [B, F, w] and calibrated accept probabilities [B, F, w] of the w
    children of each of the F frontier nodes per request (alpha, beta [B, 1])."""
    top1 = rng.beta(alpha, beta, size=frontier)  # [B, F]
    rank = np.arange(width)
    p = top1[..., None] * (1.0 - top1[..., None]) ** rank  # [..., frontier, w]
    accept = model.calibrate(p)
    total = accept.sum(axis=-1, keepdims=True)
    # Siblings are exclusive outcomes of one target token: their probabilities sum to <= 1.
    accept = np.where(total > 1.0, accept / np.maximum(total, 1e-12), accept)
    return p, accept


def draft_trees(
    model: AcceptanceModel,
    rng: np.random.Generator,
    alpha: np.ndarray,
    beta: np.ndarray,
    depth: int,
    width: int,
) -> SampledTrees:
    """Beam search of `depth` x `width` for B requests; alpha, beta [B]: each request's Beta
    parameters of the draft's top-1 probability."""
    if depth < 1 or width < 1:
        raise ValueError(f"depth and width must be >= 1, got {depth}, {width}")
    num_requests = alpha.shape[0]
    a, b = alpha[:, None], beta[:, None]
    parents = np.empty((num_requests, depth * width), dtype=np.int64)
    path_prob = np.empty((num_requests, depth * width))
    accept_prob = np.empty((num_requests, depth * width))
    # Level 1: the root's top-w children.
    p, acc = _children(model, rng, a, b, (num_requests, 1), width)
    parents[:, :width] = -1
    path_prob[:, :width] = p[:, 0]
    accept_prob[:, :width] = acc[:, 0]
    rows = np.arange(num_requests)[:, None]
    for level in range(1, depth):
        start = level * width
        frontier_f = path_prob[:, start - width : start]  # [B, w]
        p, acc = _children(model, rng, a, b, (num_requests, width), width)
        f = (frontier_f[:, :, None] * p).reshape(num_requests, width * width)  # [B, w*w]
        # Keep the w best by f; ties toward the lower (parent, rank) index (stable sort).
        keep = np.argsort(-f, axis=1, kind="stable")[:, :width]  # [B, w]
        parents[:, start : start + width] = start - width + keep // width
        path_prob[:, start : start + width] = f[rows, keep]
        accept_prob[:, start : start + width] = acc.reshape(num_requests, width * width)[rows, keep]
    return SampledTrees(parents, path_prob, accept_prob, depth, width)


def accept_walk(
    trees: SampledTrees, selected: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Accepted draft tokens [B] int (bonus not counted) when the target verifies the selected
    nodes (`selected` [B, N] bool, closed under parent), and each request's deepest accepted
    node [B] int (-1: none; the accepted path is it and its ancestors).

    From the root, level by level: the target emits one token after the accepted node; it is
    child k of that node with probability accept_prob[k] (siblings exclusive, one uniform draw
    per request and level). The walk continues if that child was selected, else it stops.
    """
    num_requests = trees.num_requests
    width = trees.width
    current = np.full(num_requests, -1, dtype=np.int64)  # accepted node (-1 = root)
    alive = np.ones(num_requests, dtype=bool)
    accepted = np.zeros(num_requests, dtype=np.int64)
    rows = np.arange(num_requests)
    for level in range(trees.depth):
        if not alive.any():
            break
        span = slice(level * width, (level + 1) * width)
        is_child = trees.parents[:, span] == current[:, None]  # [B, w]
        cum = np.cumsum(np.where(is_child, trees.accept_prob[:, span], 0.0), axis=1)  # [B, w]
        draw = rng.random(num_requests)
        hit = (draw[:, None] < cum) & is_child  # the first True is the emitted child
        found = hit.any(axis=1)
        node = level * width + hit.argmax(axis=1)
        ok = alive & found & selected[rows, node]
        accepted += ok
        current = np.where(ok, node, current)
        alive = ok
    return accepted, current
