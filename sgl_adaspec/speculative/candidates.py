"""Candidate trees: what the draft model proposes for each request before selection.

Dims (the same letters everywhere in `speculative/` and `scheduler/`):
- B: requests in the batch (the paper's n). The paper calls the token budget "B"; here it is
  always spelled `budget`.
- N: candidate nodes per request (padded to the largest request; `valid` marks real nodes).

Glossary:
- root: the request's last committed token. It is not a candidate node (it has no slot in the
  [B, N] tensors); it is always verified, and a parent index of -1 means "child of the root".
- path probability f(v): product of the draft probabilities along root..v (AdaServe eq. 7), the
  estimate that the target accepts the whole path to v. f(root) = 1 and f never increases from a
  node to its child, so selecting by descending f with ties broken toward earlier nodes always
  yields a subtree that contains every selected node's parent.
- accepted tokens: the draft tokens on the longest path the target agrees with.
- bonus token: the one token the target itself produces after the accepted path (at the root
  when nothing is accepted). Every verification yields it, so a request gains
  `accepted + 1` tokens per iteration; the root is where that token comes from.
- expected accepted (AdaServe Theorem 3.1): E[acc(T)] = sum_{v in T} f(v) over the tree T
  *including the root*, i.e. `1 + sum of f over the selected candidate nodes`. The "1" is the
  bonus token; this count is what the paper's n_acc tracks (it starts at 1.0).
- budget: the number of tokens verified in one target forward over the whole batch, roots
  included (the paper's constraint sum_i |T_i| <= B counts each tree's root).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import torch

from sgl_adaspec.speculative.host_copy import to_host


@dataclass(frozen=True)
class Candidates:
    """Per-request candidate trees, padded to N nodes.

    Node order: any order in which a parent precedes its children (breadth-first, as a beam
    search produces it, is the usual one). Fields:
    - tokens [B, N] int64: the draft token of each node;
    - parents [B, N] int64: index of the parent node in the same row, -1 for a child of the root;
    - path_prob [B, N] float: f(v) in [0, 1], never larger than the parent's f;
    - valid [B, N] bool: False marks padding (its other fields are ignored). A valid node's
      parent is valid;
    - beam: (depth, width) where the builder knows every valid node lies within a beam search of
      that shape (`of_beam`), so narrowing to it is a no-op; None where unknown.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    path_prob: torch.Tensor
    valid: torch.Tensor
    beam: tuple[int, int] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        fields = {
            "tokens": self.tokens,
            "parents": self.parents,
            "path_prob": self.path_prob,
            "valid": self.valid,
        }
        for name, value in fields.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"Candidates.{name} must be a torch.Tensor, got {type(value)}")
            if value.ndim != 2:
                raise ValueError(
                    f"Candidates.{name} must be [B, N], got shape {tuple(value.shape)}"
                )
            if value.shape != self.tokens.shape:
                raise ValueError(
                    f"Candidates.{name} has shape {tuple(value.shape)}, tokens has "
                    f"{tuple(self.tokens.shape)}; all fields must be [B, N]"
                )
            if value.device != self.tokens.device:
                raise ValueError(
                    f"Candidates.{name} is on {value.device}, tokens on {self.tokens.device}"
                )
        if self.tokens.dtype != torch.int64:
            raise TypeError(f"Candidates.tokens must be int64, got {self.tokens.dtype}")
        if self.parents.dtype != torch.int64:
            raise TypeError(f"Candidates.parents must be int64, got {self.parents.dtype}")
        if not self.path_prob.is_floating_point():
            raise TypeError(f"Candidates.path_prob must be floating, got {self.path_prob.dtype}")
        if self.valid.dtype != torch.bool:
            raise TypeError(f"Candidates.valid must be bool, got {self.valid.dtype}")
        self._check_tree()

    def _check_tree(self) -> None:
        num_nodes = self.num_nodes
        if num_nodes == 0:
            return
        node_index = torch.arange(num_nodes, device=self.parents.device)  # [N]
        bad = (self.parents < -1) | (self.parents >= node_index)
        if bool(bad.any()):
            b, j = (int(x) for x in bad.nonzero()[0])
            raise ValueError(
                f"Candidates.parents[{b}, {j}] = {int(self.parents[b, j])}: a parent must be -1 "
                f"(the root) or an earlier node index (< {j})"
            )
        has_parent = self.parents >= 0  # [B, N]
        parent_slot = self.parents.clamp(min=0)  # [B, N]
        parent_valid = self.valid.gather(1, parent_slot) | ~has_parent  # [B, N]
        bad = self.valid & ~parent_valid
        if bool(bad.any()):
            b, j = (int(x) for x in bad.nonzero()[0])
            raise ValueError(
                f"Candidates node [{b}, {j}] is valid but its parent {int(self.parents[b, j])} is "
                f"padding"
            )
        prob = self.path_prob
        bad = self.valid & ~((prob >= 0) & (prob <= 1))  # NaN fails both comparisons
        if bool(bad.any()):
            b, j = (int(x) for x in bad.nonzero()[0])
            raise ValueError(
                f"Candidates.path_prob[{b}, {j}] = {float(prob[b, j])}: must be in [0, 1]"
            )
        parent_prob = torch.where(has_parent, prob.gather(1, parent_slot), 1.0)  # [B, N]
        bad = self.valid & (prob > parent_prob)
        if bool(bad.any()):
            b, j = (int(x) for x in bad.nonzero()[0])
            raise ValueError(
                f"Candidates.path_prob[{b}, {j}] = {float(prob[b, j])} exceeds its parent's "
                f"{float(parent_prob[b, j])}: a path probability never increases along a path "
                f"(build it as parent_prob * p, not from summed log-probs without clamping)"
            )

    def with_path_prob(self, path_prob: torch.Tensor) -> Candidates:
        """The same trees with `path_prob` [B, N] (a monotone map of f into [0, 1], e.g.
        calibrated f'), each node capped at its parent's: a monotone map keeps f(child) <=
        f(parent) but its rounding may not."""
        return self.derived(path_prob=cap_at_parents(path_prob, self.parents))

    def derived(
        self, *, path_prob: torch.Tensor | None = None, valid: torch.Tensor | None = None
    ) -> Candidates:
        """The same trees (tokens, parents) with new `path_prob` and/or a narrowed `valid`,
        not checked again: the caller keeps them a tree's (f in [0, 1] and never above the
        parent's; valid closed under parent). The nodes' depths carry over: checking and
        re-deriving them for the two trees derived per iteration was a tenth of the policy's
        time."""
        return Candidates.trusted(
            self.tokens, self.parents, self.path_prob if path_prob is None else path_prob,
            self.valid if valid is None else valid, self.beam, self._known_depth,
        )  # fmt: skip

    @property
    def _known_depth(self) -> torch.Tensor | None:
        """The nodes' depths where known without a walk (cached or given), else None."""
        return self.__dict__.get("depth")

    @classmethod
    def trusted(
        cls, tokens: torch.Tensor, parents: torch.Tensor, path_prob: torch.Tensor,
        valid: torch.Tensor, beam: tuple[int, int] | None = None,
        depth: torch.Tensor | None = None,
    ) -> Candidates:
        """Trees built to be valid (the adapter's, from SGLang's tree), not checked: the
        checks read the tensors on the host, a device synchronisation on a GPU. `depth` [B, N]:
        the nodes' depths where the builder knows them (else walked when first read)."""
        tree = object.__new__(cls)
        for name, value in (
            ("tokens", tokens), ("parents", parents), ("path_prob", path_prob), ("valid", valid),
            ("beam", beam),
        ):  # fmt: skip
            object.__setattr__(tree, name, value)
        if depth is not None:
            tree.__dict__["depth"] = depth
        return tree

    @classmethod
    def of_beam(
        cls, tokens: torch.Tensor, parents: torch.Tensor, path_prob: torch.Tensor,
        valid: torch.Tensor, depth: int, width: int,
    ) -> Candidates:
        """Checked trees of a depth x width beam laid out level by level (nodes
        [l * width, (l + 1) * width) at depth l + 1; `valid` may narrow them): the nodes'
        depths and the shape come from the layout, not from walking the parents."""
        if tokens.shape[1] != depth * width:
            raise ValueError(
                f"a {depth} x {width} beam has {depth * width} nodes, got {tokens.shape[1]}"
            )
        tree = cls(tokens, parents, path_prob, valid, (depth, width))
        level = torch.arange(depth * width, device=parents.device) // width + 1  # [N]
        tree.__dict__["depth"] = level.expand_as(parents)
        return tree

    def to_host(self) -> Candidates:
        """The same trees on their way to the host (`host_copy.to_host`), for a read after
        the iteration's buffers were reused."""
        depth = self._known_depth
        return Candidates.trusted(
            *(to_host(t) for t in (self.tokens, self.parents, self.path_prob, self.valid)),
            self.beam, None if depth is None else to_host(depth),
        )

    def rows(self, index: torch.Tensor) -> Candidates:
        """The trees of the requests `index` [R] int64, in that order, not checked again (the
        depths carry over)."""
        depth = self._known_depth
        return Candidates.trusted(
            self.tokens[index], self.parents[index], self.path_prob[index], self.valid[index],
            self.beam, None if depth is None else depth[index],
        )

    def path_mask(self, nodes: torch.Tensor) -> torch.Tensor:
        """nodes [B] int64 (a node index per request, -1: none) -> [B, N] bool: each node and
        its ancestors (e.g. a request's accepted path, from its deepest accepted node). Walked
        in Python over the parents' list: a path is a few nodes, cheaper to walk than a
        round of tensor ops per level."""
        mask = torch.zeros_like(self.valid)
        parents = self.parents.tolist()
        rows, cols = [], []
        for row, node in enumerate(nodes.tolist()):
            while node >= 0:
                rows.append(row)
                cols.append(node)
                node = parents[row][node]
        if rows:
            mask[rows, cols] = True
        return mask

    @property
    def num_requests(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]

    @property
    def num_valid(self) -> torch.Tensor:
        """[B] int64: real (non-padding) candidate nodes per request."""
        return self.valid.sum(dim=1)

    @cached_property
    def depth(self) -> torch.Tensor:
        """[B, N] int64: depth of each node; children of the root have depth 1 (tensor work
        only, `jump_to_root`)."""
        return 1 + jump_to_root(self.parents, (self.parents >= 0).long(), torch.add)

    @cached_property
    def max_depth(self) -> torch.Tensor:
        """[B] int64: depth of each request's deepest valid node (0 when it has none)."""
        if self.num_nodes == 0:
            return torch.zeros(self.num_requests, dtype=torch.int64, device=self.tokens.device)
        return torch.where(self.valid, self.depth, 0).amax(dim=1)


def cap_at_parents(path_prob: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """path_prob [B, N] with every node capped at its parent's (parents [B, N], -1: the root),
    so f never increases along a path whatever rounding did to it."""
    return path_min(path_prob, parents)


def path_min(values: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """[B, N]: each node's minimum of `values` [B, N] (float, or bool for "all") over itself
    and its ancestors (parents [B, N], -1: a child of the root)."""
    return jump_to_root(parents, values, torch.minimum)


def jump_to_root(parents: torch.Tensor, values: torch.Tensor, combine) -> torch.Tensor:
    """Each node's `values` combined (`combine`, associative) with those of all its ancestors,
    by pointer jumping: ceil(log2 N) rounds of gathers over [B, N] (parents [B, N], -1: a
    child of the root), no host read, so it runs between a GPU's draft and verify unsynced."""
    num_nodes = parents.shape[1]
    ancestor = parents
    for _ in range(math.ceil(math.log2(num_nodes)) if num_nodes > 1 else 0):
        has = ancestor >= 0
        slot = ancestor.clamp(min=0)
        values = torch.where(has, combine(values, values.gather(1, slot)), values)
        ancestor = torch.where(has, ancestor.gather(1, slot), ancestor)
    return values
