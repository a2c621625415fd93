"""Latency model of one serving instance: target verify / prefill passes and draft steps.

Two kinds of forward-cost curves:
- `Roofline` (GPU presets): a forward over `tokens` new tokens whose requests hold
  `context_tokens` cached tokens in total costs
      max(weight_bytes / bandwidth, 2 * params * tokens / flops)   # weights once, or compute
      + kv_bytes_per_token * context_tokens / bandwidth              # each request's KV, once
      + overhead_ms                                                  # launches, sampling, TP sync
  per GPU of a tensor-parallel group (weights, KV and FLOPs split evenly). The crossing of the
  two terms of the max is the verify-budget knee. Attention FLOPs and KV writes are ignored (a
  1000-token prompt adds < 1 % to an 8B prefill).
- `Table` (CPU presets, and the measured GPU one): a measured latency-vs-tokens profile, linearly
  interpolated, flat below the first point, extended with the last segment's slope above the
  last one, plus `context_ms_per_token` per cached token (0 for the CPU profiles, taken at one
  context length).

`LatencyModel` pairs a target curve with a draft curve and records, per number, where it comes
from (`provenance`: measured on this project's machine / published / derived / assumed).

Glossary: a *verify pass* is one target forward over every selected node of every request
(roots included); a *draft step* is one draft forward (step 1 over one token per request, later
steps over the beam frontier, n * w tokens); *prefill* is the target forward over new prompts
(plus the draft's over the same prompts when the policy speculates).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from importlib import resources

from sgl_adaspec.scheduler.cost_model import VerifyCostProfile

# Context per request at which the baseline TPOT (no speculation, batch 1) is taken.
BASELINE_CONTEXT_TOKENS = 512


@dataclass(frozen=True)
class ModelSpec:
    name: str
    num_params: float
    kv_bytes_per_token: float  # all layers, K and V
    bytes_per_param: float = 2.0  # bf16

    @property
    def weight_bytes(self) -> float:
        return self.num_params * self.bytes_per_param


@dataclass(frozen=True)
class HardwareSpec:
    """Achievable (not datasheet) per-GPU figures; `num_gpus` is the tensor-parallel degree."""

    name: str
    bandwidth_bytes_per_s: float
    flops_per_s: float
    num_gpus: int = 1


@dataclass(frozen=True)
class Roofline:
    model: ModelSpec
    hardware: HardwareSpec
    overhead_ms: float

    def forward_ms(self, tokens: int, context_tokens: int) -> float:
        hw, model = self.hardware, self.model
        weights_s = model.weight_bytes / hw.num_gpus / hw.bandwidth_bytes_per_s
        compute_s = 2.0 * model.num_params * tokens / (hw.flops_per_s * hw.num_gpus)
        kv_s = model.kv_bytes_per_token * context_tokens / hw.num_gpus / hw.bandwidth_bytes_per_s
        return 1000.0 * (max(weights_s, compute_s) + kv_s) + self.overhead_ms


@dataclass(frozen=True)
class Table:
    """Piecewise-linear latency over tokens; `tokens` ascending, >= 2 points."""

    tokens: tuple[int, ...]
    latency_ms: tuple[float, ...]
    context_ms_per_token: float = 0.0  # each cached token of the batch read once (KV bytes)

    def __post_init__(self) -> None:
        # Same validation as the server's start-up profile.
        VerifyCostProfile(self.tokens, self.latency_ms)
        if any(b < a for a, b in zip(self.latency_ms, self.latency_ms[1:])):
            raise ValueError(f"Table latencies must not decrease with tokens: {self.latency_ms}")

    def forward_ms(self, tokens: int, context_tokens: int) -> float:
        return self._tokens_ms(tokens) + self.context_ms_per_token * context_tokens

    def _tokens_ms(self, tokens: int) -> float:
        xs, ys = self.tokens, self.latency_ms
        if tokens <= xs[0]:
            return ys[0]
        for i in range(1, len(xs)):
            if tokens <= xs[i] or i == len(xs) - 1:
                slope = (ys[i] - ys[i - 1]) / (xs[i] - xs[i - 1])
                return ys[i - 1] + slope * (tokens - xs[i - 1])
        raise AssertionError("unreachable")

    def scaled(self, factor: float) -> "Table":
        return Table(
            self.tokens,
            tuple(factor * y for y in self.latency_ms),
            factor * self.context_ms_per_token,
        )


ForwardCost = Roofline | Table


@dataclass(frozen=True)
class LatencyModel:
    name: str
    description: str
    target: ForwardCost
    draft: ForwardCost
    # What each figure is and where it comes from: "measured" | "published" | "derived" |
    # "assumed", followed by the source.
    provenance: dict[str, str] = field(default_factory=dict)

    def verify_ms(self, batch_tokens: int, context_tokens: int) -> float:
        """One target forward over `batch_tokens` tokens (decode: one per request; verify: every
        selected node, roots included) with `context_tokens` cached tokens over the batch."""
        if batch_tokens < 1 or context_tokens < 0:
            raise ValueError(f"need tokens >= 1, context >= 0: {batch_tokens}, {context_tokens}")
        return self.target.forward_ms(batch_tokens, context_tokens)

    def draft_step_ms(self, batch_tokens: int, context_tokens: int) -> float:
        if batch_tokens < 1 or context_tokens < 0:
            raise ValueError(f"need tokens >= 1, context >= 0: {batch_tokens}, {context_tokens}")
        return self.draft.forward_ms(batch_tokens, context_tokens)

    def prefill_ms(self, prompt_tokens: int, with_draft: bool) -> float:
        """Prefill of new prompts (no cached context); the draft prefills them too when the
        policy speculates (SGLang's EAGLE runs a draft extend after the target's prefill)."""
        total = self.verify_ms(prompt_tokens, 0)
        if with_draft:
            total += self.draft_step_ms(prompt_tokens, 0)
        return total

    @property
    def baseline_tpot_ms(self) -> float:
        """TPOT without speculation at near-zero load: one request, one token per forward, with
        BASELINE_CONTEXT_TOKENS of context. Classes relative to the baseline use it."""
        return self.verify_ms(1, BASELINE_CONTEXT_TOKENS)

    def verify_profile(
        self, num_draft_tokens: int = 8, max_requests: int = 256
    ) -> VerifyCostProfile:
        """What the server's start-up profile would measure: verify passes of 1, 2, 4, ...
        requests with `num_draft_tokens` tokens each (SGLang's dummy run: short context)."""
        sizes = [2**i for i in range(max_requests.bit_length()) if 2**i <= max_requests]
        tokens = tuple(bs * num_draft_tokens for bs in sizes)
        return VerifyCostProfile(tokens, tuple(self.verify_ms(t, 0) for t in tokens))


# --- presets --------------------------------------------------------------------------------------

# Model shapes from the public Hugging Face configs; kv bytes per token =
# layers * kv_heads * head_dim * 2 (K, V) * 2 bytes.
LLAMA_8B = ModelSpec("Llama-3.1-8B", 8.03e9, 32 * 8 * 128 * 2 * 2)
LLAMA_70B = ModelSpec("Llama-3.1-70B", 70.6e9, 80 * 8 * 128 * 2 * 2)
LLAMA_1B = ModelSpec("Llama-3.2-1B", 1.24e9, 16 * 8 * 64 * 2 * 2)

H100 = HardwareSpec("H100-SXM", bandwidth_bytes_per_s=3.0e12, flops_per_s=600e12)
A100_TP4 = HardwareSpec("A100-SXM4-80GB", 1.8e12, 200e12, num_gpus=4)
A100_ONE = HardwareSpec("A100-SXM4-80GB", bandwidth_bytes_per_s=1.8e12, flops_per_s=200e12)


def _overhead_for_tpot(model: ModelSpec, hw: HardwareSpec, tpot_ms: float) -> float:
    """The fixed overhead that makes a batch-1 decode at the baseline context take `tpot_ms`."""
    bare = Roofline(model, hw, 0.0).forward_ms(1, BASELINE_CONTEXT_TOKENS)
    if bare >= tpot_ms:
        raise ValueError(f"roofline alone ({bare:.2f} ms) exceeds the target TPOT {tpot_ms} ms")
    return tpot_ms - bare


def _h100_llama8b() -> LatencyModel:
    return LatencyModel(
        name="h100-llama8b",
        description="Llama-3.1-8B target + Llama-3.2-1B draft, one H100-SXM (roofline)",
        target=Roofline(LLAMA_8B, H100, _overhead_for_tpot(LLAMA_8B, H100, 1000 / 158)),
        draft=Roofline(LLAMA_1B, H100, 0.3),
        provenance={
            "model sizes": "published: HF configs (8.03B, 1.24B params; GQA 8 KV heads, bf16)",
            "bandwidth 3.0 TB/s": "published: one measured H100 device copy (datasheet 3.35)",
            "flops 600 TFLOP/s": "assumed: 75% of one measured 798 TFLOP/s 8192^3 bf16 matmul",
            "target overhead": "derived: batch-1 TPOT = 6.33 ms = SGLang docs' 158 tok/s "
            "(Llama-3.1-8B, one H100, no speculation)",
            "draft overhead 0.3 ms/step": "assumed",
        },
    )


def _a100x4_llama70b() -> LatencyModel:
    return LatencyModel(
        name="a100x4-llama70b",
        description="Llama-3.1-70B target TP4 on 4x A100-80GB + Llama-3.2-1B draft on one GPU",
        target=Roofline(LLAMA_70B, A100_TP4, _overhead_for_tpot(LLAMA_70B, A100_TP4, 30.0)),
        draft=Roofline(LLAMA_1B, A100_ONE, 0.5),
        provenance={
            "model sizes": "published: HF configs (70.6B, 1.24B params; bf16)",
            "bandwidth 1.8 TB/s/GPU": "assumed: 90% of the 2.0 TB/s datasheet figure",
            "flops 200 TFLOP/s/GPU": "assumed: 64% of the 312 TFLOP/s dense bf16 datasheet figure",
            "target overhead": "derived: batch-1 TPOT = 30 ms, the AdaServe artifact's baseline "
            "(TP sync, launches)",
            "draft overhead 0.5 ms/step": "assumed",
        },
    )


# This project's CPU machine, tiny fixture Llama (docs/results.md).
TINY_VERIFY = Table((8, 16, 32, 64), (1.28, 1.31, 1.47, 2.10))
# EAGLE run with accept length 1.0: 166.1 tok/s = 6.02 ms per iteration = one ~1.28 ms verify +
# 4 draft forwards (3 steps + the extend) -> 1.19 ms per draft forward, i.e. 0.93x the verify.
TINY_DRAFT_FACTOR = (1000 / 166.1 - 1.28) / 4 / 1.28


def _cpu_tiny() -> LatencyModel:
    return LatencyModel(
        name="cpu-tiny",
        description="tiny fixture Llama + EAGLE draft, this project's 2-core CPU (measured table)",
        target=TINY_VERIFY,
        draft=TINY_VERIFY.scaled(TINY_DRAFT_FACTOR),
        provenance={
            "verify 8/16/32/64 tokens = 1.28/1.31/1.47/2.10 ms": "measured: docs/results.md, "
            "server start-up profile",
            "below 8 tokens flat, above 64 last slope": "assumed",
            "draft step = 0.93x verify": "derived: docs/results.md EAGLE 166.1 tok/s at accept "
            "length 1.0 (6.02 ms/iteration, 4 draft forwards); same shape as verify assumed",
            "context cost": "assumed 0 (profile taken at one context)",
        },
    )


SMOLLM2_VERIFY = Table((1, 8, 16, 64), (53.0, 98.0, 168.0, 250.0))


def _cpu_smollm2() -> LatencyModel:
    return LatencyModel(
        name="cpu-smollm2",
        description="SmolLM2-135M fp32 target on the 2-core CPU (measured table), tiny draft",
        target=SMOLLM2_VERIFY,
        draft=TINY_VERIFY.scaled(TINY_DRAFT_FACTOR),
        provenance={
            "verify 1/8/16/64 tokens = 53/98/168/250 ms": "measured: architecture.md (HF eager, "
            "2 threads, context 512)",
            "draft": "assumed: the tiny fixture's draft step (no SmolLM2 draft was measured)",
        },
    )


# --- measured on a GPU (benchmarks/gpu_forward_cost.py; docs/simulator.md) ----------------------

# What `benchmarks/gpu_forward_cost.py` measured on each lent GPU (sim/data/).
MEASURED_FILES = {"h100": "h100_forward_cost.json", "h200": "h200_forward_cost.json"}
# A one-layer EAGLE head of Llama-3.1-8B caches one layer's K and V: 1/32 of the target's bytes.
EAGLE_8B_KV_BYTES_PER_TOKEN = 1 * 8 * 128 * 2 * 2
# The longest prompt a measured table keeps: the simulator's prefills sum many prompts, priced
# by the GEMMs; one 8192-token prompt also pays its quadratic attention (+26 %).
MAX_TABLE_TOKENS_PER_REQUEST = 2048


def context_cost_ms_per_token(points: list[dict]) -> float:
    """Least-squares slope of a forward's time over its batch's cached tokens, fitted within
    groups of points that differ only in context (same batch, same tokens per request)."""
    groups: dict[tuple[int, int], list[dict]] = {}
    for p in points:
        groups.setdefault((p["batch"], p["tokens_per_request"]), []).append(p)
    num = den = 0.0
    for group in groups.values():
        if len({p["context"] for p in group}) < 2:
            continue
        xs = [p["batch"] * p["context"] for p in group]
        ys = [p["median_ms"] for p in group]
        mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
        num += sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))
        den += sum((x - mean_x) ** 2 for x in xs)
    if den == 0:
        raise ValueError("no measured points differ only in context: cannot fit its cost")
    return num / den


def measured_table(points: list[dict], context_ms_per_token: float) -> Table:
    """A Table from measured forwards (`benchmarks/gpu_forward_cost.py` points): per token count,
    the median of the forwards' times less their context's cost, then made non-decreasing in
    tokens (a larger forward never costs less; a dip is timing noise)."""
    by_tokens: dict[int, list[float]] = {}
    for p in points:
        context_ms = context_ms_per_token * p["batch"] * p["context"]
        by_tokens.setdefault(p["tokens"], []).append(p["median_ms"] - context_ms)
    tokens = sorted(by_tokens)
    latency, floor = [], 0.0
    for t in tokens:
        floor = max(floor, statistics.median(by_tokens[t]))
        latency.append(floor)
    return Table(tuple(tokens), tuple(latency), context_ms_per_token)


def table_points(points: list[dict]) -> list[dict]:
    """The measured points a table is built from (`MAX_TABLE_TOKENS_PER_REQUEST`)."""
    return [p for p in points if p["tokens_per_request"] <= MAX_TABLE_TOKENS_PER_REQUEST]


def load_measured(gpu: str = "h100") -> dict:
    text = resources.files("sgl_adaspec.sim").joinpath("data", MEASURED_FILES[gpu]).read_text()
    return json.loads(text)


def _measured_llama8b(gpu: str) -> LatencyModel:
    measured = load_measured(gpu)
    shapes = measured["shapes"]
    target_points = table_points(shapes["llama-3.1-8b"]["points"])
    per_token = context_cost_ms_per_token(target_points)
    draft_per_token = per_token * EAGLE_8B_KV_BYTES_PER_TOKEN / LLAMA_8B.kv_bytes_per_token
    kv_tb_per_s = LLAMA_8B.kv_bytes_per_token / (per_token * 1e-3) / 1e12
    return LatencyModel(
        name=f"{gpu}-llama8b-measured",
        description=f"Llama-3.1-8B target + its one-layer EAGLE head, one {gpu.upper()} "
        "(measured forwards)",
        target=measured_table(target_points, per_token),
        draft=measured_table(shapes["eagle-llama-3.1-8b"]["points"], draft_per_token),
        provenance={
            "target forward": "measured: benchmarks/gpu_forward_cost.py, one "
            f"{measured['device']} (sim/data/{MEASURED_FILES[gpu]}): a Llama-3.1-8B-shaped "
            "decoder in plain PyTorch, random bf16 weights, CUDA graphs; per token count the "
            "median forward less its context cost",
            "context cost": f"measured: {per_token * 1e6:.1f} ns per cached token of the batch "
            f"(KV read at {kv_tb_per_s:.2f} TB/s), the slope over points differing in context",
            "draft step": "measured: the same script, a one-layer EAGLE head of the 8B shape "
            "(LM head included, its input projection left out)",
            "draft context cost": "derived: the target's cost per KV byte, 1/32 of its bytes",
            "scheduler and sampling time": "assumed 0: on the H100 the plain forward at batch 1 "
            "(6.50 ms) already exceeds SGLang's served TPOT on this model (6.33 ms, its docs' "
            "158 tok/s)",
        },
    )


PRESETS = {
    "h100-llama8b": _h100_llama8b,
    "h100-llama8b-measured": lambda: _measured_llama8b("h100"),
    "h200-llama8b-measured": lambda: _measured_llama8b("h200"),
    "a100x4-llama70b": _a100x4_llama70b,
    "cpu-tiny": _cpu_tiny,
    "cpu-smollm2": _cpu_smollm2,
}


def get_preset(name: str) -> LatencyModel:
    try:
        return PRESETS[name]()
    except KeyError:
        raise KeyError(f"unknown latency preset {name!r}; choose one of: {', '.join(PRESETS)}")
