"""How well the fitted model matches the recorded statistics: Brier scores, calibration errors,
accepted chain lengths measured and simulated, and the text report `fit` prints."""

from __future__ import annotations

import math

import numpy as np

from sgl_adaspec.sim.acceptance import AcceptanceModel
from sgl_adaspec.sim.calibration.stats import BIN_EDGES, Bins, ClassAcceptance


def simulated_chain_accept(model: AcceptanceModel, cls: str, depth: int, n: int = 20000) -> float:
    """Mean accepted drafts of a depth-`depth` chain under the fitted model (simulator's trees)."""
    from sgl_adaspec.sim.trees import accept_walk, draft_trees

    alpha, beta = model.class_params([cls] * n)
    rng = np.random.default_rng(0)
    trees = draft_trees(model, rng, alpha, beta, depth, 1)
    return float(accept_walk(trees, np.ones(trees.parents.shape, bool), rng)[0].mean())


def evaluation(classes: dict[str, ClassAcceptance], model: AcceptanceModel) -> dict:
    curve = (np.array(model.calibration_p), np.array(model.calibration_accept))
    out = {}
    for c, s in classes.items():
        node = s.node_pooled()
        out[c] = {
            "top1_mean": s.top1.mean,
            "top1_std": math.sqrt(s.top1.var),
            "greedy_agreement": s.greedy_agreement(),
            "in_top_w": float(sum(b.accepted.sum() for b in s.node) / max(s.positions, 1)),
            "node_brier": node.brier(),
            "node_ece": node.ece(),
            "node_ece_fitted_curve": node.ece(curve),
            "path_brier": s.path.brier(),
            "path_ece": s.path.ece(),
            "chain_accept": {d: s.chain_accept_mean(d) for d in (1, 3, 5, 8)},
            "chain_accept_model": {d: simulated_chain_accept(model, c, d) for d in (1, 3, 5, 8)},
        }
    return out


def report(classes: dict[str, ClassAcceptance], model: AcceptanceModel) -> str:
    ev = evaluation(classes, model)
    lines = [
        (
            "class          prompts  pos  top1 mean/std  agree  in-top4  node Brier  node ECE"
            "  ECE(fit)  path Brier  path ECE  chain acc d=1/3/5/8 (measured | model)"
        ),
    ]
    for c, e in ev.items():
        s = classes[c]
        m = "/".join(f"{e['chain_accept'][d]:.2f}" for d in (1, 3, 5, 8))
        sim = "/".join(f"{e['chain_accept_model'][d]:.2f}" for d in (1, 3, 5, 8))
        lines.append(
            f"{c:<14} {s.prompts:>7} {s.positions:>5}  {e['top1_mean']:.3f}/{e['top1_std']:.3f}"
            f"  {e['greedy_agreement']:.3f}  {e['in_top_w']:.3f}    {e['node_brier']:.4f}"
            f"    {e['node_ece']:.4f}   {e['node_ece_fitted_curve']:.4f}     {e['path_brier']:.4f}"
            f"    {e['path_ece']:.4f}  {m} | {sim}"
        )
    lines.append("")
    lines.append("beta fit: " + ", ".join(
        f"{c} Beta({b.alpha:.3f}, {b.beta:.3f})" for c, b in model.top1.items()))  # fmt: skip
    lines.append("rank mean p: " + "; ".join(
        f"{c} " + "/".join(f"{x / max(s.positions, 1):.3f}" for x in s.rank_sum_p)
        for c, s in classes.items()))  # fmt: skip
    lines.append("acceptance per bin (pooled classes and ranks; bin: mean p -> rate, count):")
    pooled = Bins.empty()
    for s in classes.values():
        pooled = pooled + s.node_pooled()
    for i in range(len(BIN_EDGES) - 1):
        if pooled.count[i]:
            lines.append(
                f"  [{BIN_EDGES[i]:.2f}, {BIN_EDGES[i + 1]:.2f}): "
                f"{pooled.sum_p[i] / pooled.count[i]:.3f} -> "
                f"{pooled.accepted[i] / pooled.count[i]:.3f}  (n={int(pooled.count[i])})"
            )
    lines.append(
        "fitted curve: " + ", ".join(f"({x:.3f}, {y:.3f})" for x, y in
                                     zip(model.calibration_p, model.calibration_accept))
    )  # fmt: skip
    return "\n".join(lines)
