"""Decode speed of EAGLE speculative decoding on CPU: the plugin's torch path vs SGLang's
Triton-interpreter route vs no speculation, on the tiny fixture model, measured in one run.

    python benchmarks/cpu_spec_speed.py [--tokens N] [--interpreter-tokens N]

EAGLE with steps 3, topk 2, 6 draft tokens. Each configuration runs as a real SGLang server on
127.0.0.1 and decodes the same prompts greedily; the figure per configuration is the median over
prompts of decode tokens/s (streamed, first chunk excluded so prefill does not count).
Last line: cpu_spec_speedup_vs_interpreter=<torch path / interpreter route>.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from sgl_adaspec.adapters.platform.cpu.interpreter_baseline import CPU_PATH_ENV, INTERPRETER
from sgl_adaspec.local_server.client import stream_generate
from sgl_adaspec.local_server.launch import CPU_FLAGS, Server, eagle_flags
from sgl_adaspec.models.tiny import ensure_models

PROMPTS = (
    "def quicksort(items):",
    "import json\n\nclass Config:\n",
    "for line in open(path):",
)


def measure(name: str, server: Server, max_new_tokens: int) -> tuple[float, list[str]]:
    with server:
        runs = [stream_generate(server.url, p, max_new_tokens) for p in PROMPTS]
    rates = [r.decode_tokens_per_s for r in runs]
    median = statistics.median(rates)
    print(f"{name}: decode tok/s per prompt {[round(r, 2) for r in rates]} median {median:.2f}")
    return median, [r.text for r in runs]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=96, help="new tokens per prompt")
    parser.add_argument(
        "--interpreter-tokens", type=int, default=12,
        help="new tokens per prompt on the (slow) interpreter route",
    )  # fmt: skip
    args = parser.parse_args()

    models = ensure_models()
    eagle = eagle_flags(models.eagle_draft, steps=3, topk=2, num_draft_tokens=6)
    logs = Path(tempfile.mkdtemp(prefix="cpu_spec_speed_"))
    interpreter_flags = tuple(
        "triton" if flag == "torch_native" else flag for flag in CPU_FLAGS
    )
    torch_path, torch_texts = measure(
        "a) plugin torch CPU path (EAGLE)",
        Server(models.target, eagle, log_path=logs / "torch.log"),
        args.tokens,
    )
    interpreter, interp_texts = measure(
        "b) SGLang Triton-interpreter route (EAGLE)",
        Server(
            models.target,
            eagle,
            base_flags=interpreter_flags,
            env={"TRITON_INTERPRET": "1", CPU_PATH_ENV: INTERPRETER},
            log_path=logs / "interpreter.log",
            startup_timeout_s=900,
        ),
        args.interpreter_tokens,
    )
    plain, plain_texts = measure(
        "c) no speculation", Server(models.target, log_path=logs / "plain.log"), args.tokens
    )
    same_prefix = all(
        a.startswith(b) or b.startswith(a) for a, b in zip(torch_texts, interp_texts)
    )
    print(f"greedy outputs: torch path == no speculation: {torch_texts == plain_texts}; "
          f"interpreter route agrees on its shorter prefix: {same_prefix}")
    print(f"server logs: {logs}")
    print(f"torch_path_vs_no_spec={torch_path / plain:.3f}")
    print(f"cpu_spec_speedup_vs_interpreter={torch_path / interpreter:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
