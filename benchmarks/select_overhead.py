"""CPU time of AdaServe's selection at serving scale: n = 256 requests, depth 8, width 4.

    python benchmarks/select_overhead.py [--runs N] [--threads T] [--device cuda] [--profile]

Candidates are beam-search shaped (d layers of w nodes, each node's parent in the layer above,
f = parent f * a random draft probability), N = d * w = 32 per request, budget B = 1024 tokens
(roots included), n_max = 2 * d, and three SLO mixes: A(r) uniform in [0, 3) (both phases
share the budget), in [0, d + 2) (the SLO phase takes it all), all 0 (best effort: only the
batch-wide top-k). Each figure is the median over `--runs` timed calls after warm-up. `select`
times select_adaserve on a Candidates whose tree depth is already known (cached on the object,
as it is for the rest of an iteration); `build+select` also pays Candidates' validation and
depth computation. With `--device cuda` the tensors live on the GPU (as the draft's outputs do
in a CUDA server), each timed call ends with a device synchronize, and every mix's selection is
checked equal to the CPU's. `--profile` adds, per mix, what one `select` call does under
torch.profiler (20 calls): kernel launches, host reads (`.item()`), device time against host
time. Last line: adaserve_select_ms=<the largest `select` median>.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from sgl_adaspec.speculative.candidates import Candidates
from sgl_adaspec.speculative.selection import select_adaserve, select_static

NUM_REQUESTS, DEPTH, WIDTH, BUDGET = 256, 8, 4, 1024
MAX_NODES_PER_REQUEST = 2 * DEPTH


def beam_candidates(generator: torch.Generator) -> dict[str, torch.Tensor]:
    n, d, w = NUM_REQUESTS, DEPTH, WIDTH
    parents = torch.empty(n, d * w, dtype=torch.int64)
    parents[:, :w] = -1
    for layer in range(1, d):  # parent: a random node of the previous layer
        pick = torch.randint(0, w, (n, w), generator=generator)
        parents[:, layer * w : (layer + 1) * w] = (layer - 1) * w + pick
    step_prob = torch.rand(n, d * w, generator=generator) ** 0.5
    path_prob = torch.empty(n, d * w)
    path_prob[:, :w] = step_prob[:, :w]
    for layer in range(1, d):
        cols = slice(layer * w, (layer + 1) * w)
        path_prob[:, cols] = path_prob.gather(1, parents[:, cols]) * step_prob[:, cols]
    return {
        "tokens": torch.randint(0, 32000, (n, d * w), generator=generator),
        "parents": parents,
        "path_prob": path_prob,
        "valid": torch.ones(n, d * w, dtype=torch.bool),
    }


def median_ms(fn, runs: int, device: torch.device) -> float:
    def call():
        fn()
        if device.type == "cuda":  # the selection's result is needed on the host right after
            torch.cuda.synchronize(device)

    for _ in range(10):
        call()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def profile_calls(fn, calls: int = 20) -> str:
    """Per call of `fn`: kernel launches, host reads, and device vs host time (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    events = prof.key_averages()

    def count(name: str) -> float:
        return sum(e.count for e in events if e.key == name) / calls

    device_us = sum(e.self_device_time_total for e in events) / calls
    host_us = sum(e.self_cpu_time_total for e in events) / calls
    return (
        f"{count('cudaLaunchKernel'):.0f} kernel launches, {count('aten::item'):.0f} host reads, "
        f"device {device_us / 1e3:.3f} ms, host {host_us / 1e3:.3f} ms per call"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--threads", type=int, default=None, help="default: torch's default")
    parser.add_argument("--device", default="cpu", help="where the tensors live (cpu, cuda)")
    parser.add_argument("--profile", action="store_true", help="profile 20 calls per mix")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    generator = torch.Generator().manual_seed(0)
    cpu_fields = beam_candidates(generator)
    fields = {name: tensor.to(device) for name, tensor in cpu_fields.items()}
    cands = Candidates(**fields)
    uniform = torch.rand(NUM_REQUESTS, generator=generator)
    mixes = {
        "A~U[0,3)": uniform * 3,
        f"A~U[0,{DEPTH + 2})": uniform * (DEPTH + 2),
        "best effort": torch.zeros(NUM_REQUESTS),
    }
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"torch {torch.__version__}, {where}, threads {torch.get_num_threads()}, "
          f"runs {args.runs}")
    print(f"n={NUM_REQUESTS} d={DEPTH} w={WIDTH} N={DEPTH * WIDTH} budget={BUDGET} "
          f"n_max={MAX_NODES_PER_REQUEST}")
    static_ms = median_ms(
        lambda: select_static(cands, BUDGET // NUM_REQUESTS - 1), args.runs, device
    )
    print(f"select_static: median {static_ms:.3f} ms")
    worst_ms = 0.0
    differing = 0
    for name, cpu_required in mixes.items():
        required = cpu_required.to(device)

        def select(required=required):
            return select_adaserve(cands, required, BUDGET, MAX_NODES_PER_REQUEST)

        def build_and_select(required=required):
            fresh = Candidates(**fields)
            return select_adaserve(fresh, required, BUDGET, MAX_NODES_PER_REQUEST)

        select_ms = median_ms(select, args.runs, device)
        build_ms = median_ms(build_and_select, args.runs, device)
        worst_ms = max(worst_ms, select_ms)
        selection = select()
        if device.type != "cpu":
            on_cpu = select_adaserve(
                Candidates(**cpu_fields), cpu_required, BUDGET, MAX_NODES_PER_REQUEST
            )
            differing += int(not torch.equal(on_cpu.mask, selection.mask.cpu()))
        slo_nodes = int(selection.slo_counts.sum())
        top_nodes = int(selection.counts.sum()) - slo_nodes
        print(f"{name}: select median {select_ms:.3f} ms, build+select median {build_ms:.3f} ms; "
              f"tokens {selection.total_tokens} = {NUM_REQUESTS} roots + {slo_nodes} SLO phase "
              f"+ {top_nodes} throughput phase")
        if args.profile:
            print(f"  profile: {profile_calls(select)}")
    if device.type != "cpu":
        print(f"selections differing from the CPU's: {differing} of {len(mixes)}")
    print(f"adaserve_select_ms={worst_ms:.3f}")


if __name__ == "__main__":
    main()
