"""SGLang adapter of the verify pass's token-wise early exit (the math: `early_exit`).

`hooks.target_forward` opens an `ExitRun` around the target's verify forward; this module's
AROUND hook on `LlamaModel.forward` then runs the layer stack in two parts: layers
[0, exit_layer) over every verify row, the exit test on the intermediate logits, and the
remaining layers over the surviving rows only. Rows leave through SGLang's own handoff of the
residual stream (`export_replay_handoff` / `import_replay_handoff`, made for breaking a layer
stack between a graph replay and eager layers), so the surviving rows carry their stream
values over bit for bit; the positions, KV write slots and ragged node lists the remaining
layers read shrink with them. Anything else (another model family, pipeline stages, captured
aux hidden states for EAGLE-3, a non-additive residual update) runs SGLang's forward unchanged.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import time
from dataclasses import dataclass

import torch

from sgl_adaspec.adapters.speculative.fallbacks import Fallback, fell_back
from sgl_adaspec.adapters.speculative.iteration import Verifying
from sgl_adaspec.adapters.speculative.runtime import warn_once
from sgl_adaspec.speculative.early_exit import EarlyExitPlan, exiting_rows, worth_exiting

logger = logging.getLogger(__name__)


@dataclass
class ExitRun:
    """One verify forward's early exit. R packed verify rows (request-major, kept nodes only):
    row_token / row_parent / row_request / row_node [R] int64 (row_parent: the parent's row,
    -1 for a root). The hook fills `exited` [R] bool (None: no test ran), `tested` (rows
    tested) and `test_ms` (the test's and the pruning's wall time)."""

    plan: EarlyExitPlan
    head_weight: torch.Tensor  # [V, H] the target's lm_head
    row_token: torch.Tensor
    row_parent: torch.Tensor
    row_request: torch.Tensor
    row_node: torch.Tensor
    exited: torch.Tensor | None = None
    tested: int = 0
    test_ms: float = 0.0


_RUN: contextvars.ContextVar[ExitRun | None] = contextvars.ContextVar(
    "adaspec_exit_run", default=None
)


@contextlib.contextmanager
def exit_run(run: ExitRun | None):
    token = _RUN.set(run)
    try:
        yield run
    finally:
        _RUN.reset(token)


def llama_stack(causal_lm):
    """The Llama layer stack the hook can split, or None (other families, pipeline stages,
    EAGLE-3 aux capture, a single layer: nothing after the test to save)."""
    from sglang.srt.models.llama import LlamaModel

    model = getattr(causal_lm, "model", None)
    if type(model) is not LlamaModel or model.layers_to_capture:
        return None
    if model.end_layer - model.start_layer < 2:
        return None
    if not (model.pp_group.is_first_rank and model.pp_group.is_last_rank):
        return None
    return model


def exit_layer(model, plan: EarlyExitPlan) -> int:
    """The layer before which rows leave: the plan's, or half the stack."""
    num_layers = model.end_layer - model.start_layer
    layer = num_layers // 2 if plan.exit_layer is None else plan.exit_layer
    return min(max(layer, 1), num_layers - 1)


def should_test(model, plan: EarlyExitPlan, tested_rows: int) -> bool:
    """Eq. 10 (`early_exit.worth_exiting`) with this model's depth."""
    num_layers = model.end_layer - model.start_layer
    return worth_exiting(plan, tested_rows, num_layers, exit_layer(model, plan))


def llama_model_forward(
    original,
    model,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    forward_batch,
    input_embeds: torch.Tensor | None = None,
    pp_proxy_tensors=None,
):
    """AROUND `LlamaModel.forward`: SGLang's own loop, split at the exit layer (see module)."""
    from sglang.srt.layers.layer_boundary.residual import batch as residual_batch

    run = _RUN.get()
    if run is None or not forward_batch.forward_mode.is_target_verify():
        return original(model, input_ids, positions, forward_batch, input_embeds, pp_proxy_tensors)
    split = exit_layer(model, run.plan)
    hidden = model.embed_tokens(input_ids) if input_embeds is None else input_embeds
    residual_batch.start(forward_batch)
    for i in range(model.start_layer, model.end_layer):
        if i == split:
            hidden, positions = _exit_rows(model, run, hidden, positions, forward_batch)
        hidden = model.layers[i](positions, hidden, forward_batch)
    return residual_batch.final_norm(hidden, forward_batch, model.norm)


def _exit_rows(model, run: ExitRun, hidden, positions, forward_batch):
    """Test every draft row at this layer; continue with the survivors only."""
    from sglang.srt.layers.layer_boundary.residual import batch as residual_batch

    start = time.perf_counter()
    hidden = residual_batch.complete_output(hidden, forward_batch)
    handoff = residual_batch.export_replay_handoff(hidden, forward_batch)
    exited = None
    separate = not handoff.written and handoff.residual is not None
    if not separate or handoff.update.is_plain_add:
        # [R, H] the residual stream after the layer
        stream = handoff.value + handoff.residual if separate else handoff.value
        try:
            exited = run.exited = _test(model, run, stream)
        except Exception as exc:  # the exit is an optimisation: never fail a verify for it
            fell_back(Fallback.EARLY_EXIT, exc)
    if exited is None or not bool(exited.any()):
        hidden = residual_batch.import_replay_handoff(handoff, forward_batch)
        run.test_ms = 1000 * (time.perf_counter() - start)
        return hidden, positions
    keep = (~exited).nonzero().squeeze(1)
    handoff = handoff._replace(
        value=handoff.value[keep],
        residual=None if handoff.residual is None else handoff.residual[keep],
    )
    for name in ("input_ids", "positions", "out_cache_loc"):
        setattr(forward_batch, name, getattr(forward_batch, name)[keep])
    survivors = run.row_node[keep]
    survivor_request = run.row_request[keep]
    ragged = forward_batch.spec_info  # `ragged_verify`'s: the layers after read the survivors
    ragged.kept_nodes = [survivors[survivor_request == b] for b in range(len(ragged.kept_nodes))]
    hidden = residual_batch.import_replay_handoff(handoff, forward_batch)
    run.test_ms = 1000 * (time.perf_counter() - start)
    return hidden, positions[keep]


def _test(model, run: ExitRun, stream: torch.Tensor) -> torch.Tensor:
    """exited [R] bool from the intermediate logits of the rows that are parents."""
    tested = run.row_parent >= 0
    run.tested = int(tested.sum())
    parents, parent_slot = torch.unique(run.row_parent[tested], return_inverse=True)
    x = stream[parents].float()
    # The final RMSNorm applied to the intermediate stream, then the lm_head ("logit lens"),
    # in the head's dtype (no copy of the [V, H] weights).
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + model.norm.variance_epsilon)
    normed = (normed * model.norm.weight.float()).to(run.head_weight.dtype)
    logits = torch.nn.functional.linear(normed, run.head_weight).float()  # [P, V]
    parent_logits = logits.new_zeros((run.row_token.numel(), logits.shape[1]))
    parent_logits[tested] = logits[parent_slot]
    return exiting_rows(run.row_token, run.row_parent, parent_logits, run.plan.topk)


def plan_exit_run(worker, forward_batch, verifying: Verifying) -> ExitRun | None:
    """The early exit of this verify pass, or None (not asked for, not worth it by eq. 10, or
    a setup the hook cannot split: logged once)."""
    decision = verifying.decision
    plan = decision.early_exit if decision is not None else None
    if plan is None:
        return None
    causal_lm = worker.model_runner.model
    model = llama_stack(causal_lm)
    if model is None or getattr(worker.model_runner, "tp_size", 1) != 1:
        warn_once(
            "sgl_adaspec: faser early exit needs a LlamaForCausalLM target of 2+ layers on one "
            "GPU/CPU rank without pipeline stages or aux hidden-state capture; verifying in full"
        )
        return None
    try:
        return _build_exit_run(verifying, causal_lm, model, plan, forward_batch)
    except Exception as exc:  # the exit is an optimisation: never fail a verify for it
        fell_back(Fallback.EARLY_EXIT, exc)
        return None


def _build_exit_run(
    verifying: Verifying, causal_lm, model, plan, forward_batch
) -> ExitRun | None:
    """The packed rows' tokens and tree links (see `ExitRun`), if eq. 10 says to test."""
    keep = verifying.keep
    bs, ntok = keep.shape
    parents = verifying.parents  # [bs, ntok]; kept nodes' parents are kept too
    flat_keep = keep.cpu().reshape(-1)
    rows = flat_keep.nonzero().squeeze(1)
    row_of = torch.full((bs * ntok,), -1, dtype=torch.long)
    row_of[rows] = torch.arange(rows.numel())
    request = torch.arange(bs).repeat_interleave(ntok)
    parent_flat = (parents + request.view(bs, ntok) * ntok).reshape(-1)
    row_parent = torch.where(parents.reshape(-1) >= 0, row_of[parent_flat.clamp(min=0)], -1)[rows]
    if not should_test(model, plan, int((row_parent >= 0).sum())):
        return None
    device = forward_batch.input_ids.device
    return ExitRun(
        plan=plan,
        head_weight=causal_lm.lm_head.weight[: model.vocab_size],
        row_token=forward_batch.spec_info.draft_token.reshape(-1)[rows.to(device)].long(),
        row_parent=row_parent.to(device),
        row_request=request[rows].to(device),
        row_node=(rows % ntok).to(device),
    )
