"""What one forward of a Llama-shaped decoder costs on a GPU, over the grid the simulator's
latency presets model: tokens per forward, requests per batch, cached context per request.

    python benchmarks/gpu_forward_cost.py [--device cuda|cpu] [--shapes llama-3.1-8b,...]
                                          [--out FILE.json] [--quick]

The decoder is plain PyTorch with random bf16 weights (latency does not depend on the values):
per layer RMSNorm, one fused QKV GEMM, grouped-query attention over a preallocated KV cache
(SDPA), the output GEMM, a SwiGLU MLP; then the LM head over every token and an argmax (no
rotary embedding: elementwise work, a small share of a forward). On CUDA each point is one
captured CUDA graph, replayed and timed with CUDA events, as SGLang replays its decode and
verify graphs. It is not SGLang's kernels (no fused norms, no paged attention), scheduler or
sampling: a stand-in for a serving forward's GPU time, not a figure of SGLang.
`sgl_adaspec.sim.latency` says which preset figures these measurements back.

`--device cpu --quick` runs a tiny shape on the CPU (a smoke test of the script).
Last line: <first shape>_decode_bs1_ms=<ms>.

    python benchmarks/gpu_forward_cost.py --compare FILE.json --preset NAME
                                          [--target-shape S] [--draft-shape S]

reads a measurement back (the H100's ships as sgl_adaspec/sim/data/h100_forward_cost.json) and
prints, per point, a simulator preset's forward time over the measured one.
Last line: <preset>_over_measured_min=<ratio>.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class DecoderShape:
    name: str
    hidden: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    is_draft: bool = False  # timed on the draft grid (decode and beam-step sizes)

    @property
    def num_params(self) -> int:
        """The weights the script allocates: embedding and LM head apart, also for a model that
        ties them (Llama-3.2-1B's published 1.24B counts them once)."""
        attn = self.hidden * (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        attn += self.num_heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        return self.num_layers * (attn + mlp) + 2 * self.vocab * self.hidden


# Public Hugging Face configs.
SHAPES = {
    s.name: s
    for s in (
        DecoderShape("llama-3.1-8b", 4096, 32, 32, 8, 128, 14336, 128256),
        DecoderShape("llama-3.2-1b", 2048, 16, 32, 8, 64, 8192, 128256, is_draft=True),
        # An EAGLE head for Llama-3.1-8B: one target-sized layer and the LM head (its input
        # projection of two hidden states, 4096 x 8192, is left out: 0.2 % of the bytes).
        DecoderShape("eagle-llama-3.1-8b", 4096, 1, 32, 8, 128, 14336, 128256, is_draft=True),
        DecoderShape("tiny", 64, 2, 4, 2, 16, 128, 256),
    )
}


@dataclass(frozen=True)
class Point:
    """One forward: `batch` requests, `tokens_per_request` new tokens each, `context` cached
    tokens per request (the new ones included)."""

    batch: int
    tokens_per_request: int
    context: int

    @property
    def tokens(self) -> int:
        return self.batch * self.tokens_per_request


def grouped_query_attention(
    query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
) -> torch.Tensor:
    """query [B, q, H, d], caches [B, KV, C, d] -> [B, q, H * d]; query head h reads KV head
    h // (H / KV). No mask: every new token attends to the whole cache (a tree mask changes
    which scores count, not how many are computed)."""
    B, q, H, d = query.shape
    kv = k_cache.shape[1]
    group = H // kv
    # The query heads that share a KV head ride in the query-length dim: [B, KV, q * g, d].
    grouped = query.reshape(B, q, kv, group, d).permute(0, 2, 1, 3, 4).reshape(B, kv, q * group, d)
    attn = F.scaled_dot_product_attention(grouped, k_cache, v_cache)
    return attn.view(B, kv, q, group, d).permute(0, 2, 1, 3, 4).reshape(B, q, H * d)


class RandomDecoder:
    """A Llama-shaped decoder with random weights and a KV cache for `max_kv_tokens` tokens."""

    def __init__(self, shape: DecoderShape, device: str, dtype: torch.dtype, max_kv_tokens: int):
        self.shape, s = shape, shape

        def w(*dims: int) -> torch.Tensor:
            return torch.randn(*dims, device=device, dtype=dtype) * 0.02

        qkv = (s.num_heads + 2 * s.num_kv_heads) * s.head_dim
        self.embed = w(s.vocab, s.hidden)
        self.lm_head = w(s.hidden, s.vocab)
        self.layers = [
            dict(
                qkv=w(s.hidden, qkv),
                o=w(s.num_heads * s.head_dim, s.hidden),
                gate_up=w(s.hidden, 2 * s.intermediate),
                down=w(s.intermediate, s.hidden),
                # K and V of every request, flat: viewed as [B, kv_heads, C, head_dim] per point.
                k=torch.zeros(
                    max_kv_tokens * s.num_kv_heads * s.head_dim, device=device, dtype=dtype
                ),
                v=torch.zeros(
                    max_kv_tokens * s.num_kv_heads * s.head_dim, device=device, dtype=dtype
                ),
            )
            for _ in range(s.num_layers)
        ]

    def forward(self, ids: torch.Tensor, context: int) -> torch.Tensor:
        """ids [B, q] -> next tokens [B, q]; attends over `context` cached tokens per request,
        the last q of which are the new ones (written into the cache first)."""
        s = self.shape
        B, q = ids.shape
        x = self.embed[ids]  # [B, q, hidden]
        for layer in self.layers:
            h = F.rms_norm(x, (s.hidden,))
            qkv = (h @ layer["qkv"]).view(B, q, s.num_heads + 2 * s.num_kv_heads, s.head_dim)
            query, key, value = qkv.split([s.num_heads, s.num_kv_heads, s.num_kv_heads], dim=2)
            k_cache = layer["k"][: B * s.num_kv_heads * context * s.head_dim]
            k_cache = k_cache.view(B, s.num_kv_heads, context, s.head_dim)
            v_cache = layer["v"][: B * s.num_kv_heads * context * s.head_dim]
            v_cache = v_cache.view(B, s.num_kv_heads, context, s.head_dim)
            k_cache[:, :, context - q :] = key.transpose(1, 2)
            v_cache[:, :, context - q :] = value.transpose(1, 2)
            x = x + grouped_query_attention(query, k_cache, v_cache) @ layer["o"]
            gate, up = (F.rms_norm(x, (s.hidden,)) @ layer["gate_up"]).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ layer["down"]
        return (F.rms_norm(x, (s.hidden,)) @ self.lm_head).argmax(-1)


def time_point(model: RandomDecoder, point: Point, device: str, budget_s: float) -> list[float]:
    """Milliseconds of each timed forward (at least 3, up to 20 or `budget_s`)."""
    ids = torch.randint(
        0, model.shape.vocab, (point.batch, point.tokens_per_request), device=device
    )
    if device != "cuda":
        samples, start = [], time.perf_counter()
        while len(samples) < 3 or (len(samples) < 20 and time.perf_counter() - start < budget_s):
            t0 = time.perf_counter()
            model.forward(ids, point.context)
            samples.append(1000 * (time.perf_counter() - t0))
        return samples
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            model.forward(ids, point.context)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model.forward(ids, point.context)
    graph.replay()
    torch.cuda.synchronize()
    samples, start = [], time.perf_counter()
    while len(samples) < 3 or (len(samples) < 20 and time.perf_counter() - start < budget_s):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(begin.elapsed_time(end))
    del graph
    return samples


def grid(quick: bool, draft: bool) -> list[Point]:
    if quick:
        return [Point(1, 1, 8), Point(2, 4, 16), Point(1, 16, 16)]
    decode = [Point(b, 1, 512) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
    if draft:
        return decode + [Point(b, q, 512) for b in (1, 4, 16, 64) for q in (4, 8, 16)]
    verify = [Point(b, q, 512) for b in (1, 4, 16, 64) for q in (2, 4, 8, 16, 32)]
    context = [Point(b, 4, c) for b in (16, 64) for c in (128, 2048, 4096)]
    prefill = [Point(1, n, n) for n in (128, 512, 2048, 8192)]
    return decode + verify + context + prefill


def compare(path: str, preset: str, target_shape: str, draft_shape: str) -> int:
    from sgl_adaspec.sim.latency import get_preset

    model = get_preset(preset)
    with open(path) as f:
        shapes = json.load(f)["shapes"]
    ratios = []
    for shape, cost in ((target_shape, model.verify_ms), (draft_shape, model.draft_step_ms)):
        for p in shapes[shape]["points"]:
            predicted = cost(p["tokens"], p["batch"] * p["context"])
            ratios.append(predicted / p["median_ms"])
            print(
                f"{shape} bs={p['batch']:4d} q={p['tokens_per_request']:4d} "
                f"ctx={p['context']:5d} measured {p['median_ms']:8.3f} ms, "
                f"{preset} {predicted:8.3f} ms, ratio {ratios[-1]:.3f}"
            )
    print(f"{preset}_over_measured_max={max(ratios):.3f}")
    print(f"{preset}_over_measured_min={min(ratios):.3f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--shapes", default="llama-3.1-8b,llama-3.2-1b")
    ap.add_argument("--out", default=None, help="write every sample as JSON here")
    ap.add_argument("--quick", action="store_true", help="tiny grid (a smoke test)")
    ap.add_argument("--budget-s", type=float, default=0.5, help="timing per point")
    ap.add_argument("--compare", metavar="FILE", help="compare this measurement with --preset")
    ap.add_argument("--preset", default="h100-llama8b")
    ap.add_argument("--target-shape", default="llama-3.1-8b")
    ap.add_argument("--draft-shape", default="llama-3.2-1b")
    args = ap.parse_args(argv)
    if args.compare:
        return compare(args.compare, args.preset, args.target_shape, args.draft_shape)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit(f"gpu_forward_cost: no CUDA device visible to torch {torch.__version__}")
    names = args.shapes.split(",")
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        sys.exit(f"gpu_forward_cost: unknown shape(s) {unknown}; choose from {list(SHAPES)}")
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    report = {"device": where, "torch": torch.__version__, "shapes": {}}
    first = None
    for name in names:
        torch.manual_seed(0)
        points = grid(args.quick, draft=SHAPES[name].is_draft)
        max_kv = max(p.batch * p.context for p in points)
        model = RandomDecoder(SHAPES[name], args.device, dtype, max_kv)
        rows = []
        for p in points:
            samples = time_point(model, p, args.device, args.budget_s)
            ms = statistics.median(samples)
            rows.append({**asdict(p), "tokens": p.tokens, "median_ms": ms, "samples_ms": samples})
            print(
                f"{name} bs={p.batch:4d} q={p.tokens_per_request:3d} ctx={p.context:5d} "
                f"tokens={p.tokens:5d} {ms:8.3f} ms",
                flush=True,
            )
        report["shapes"][name] = {"params": SHAPES[name].num_params, "points": rows}
        first = first or (name, rows[0]["median_ms"])
        del model
        if args.device == "cuda":
            torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    print(f"{first[0]}_decode_bs1_ms={first[1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
