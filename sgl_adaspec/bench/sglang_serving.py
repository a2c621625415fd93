"""SGLang's own serving benchmark against the server without speculation and with a spec policy.

    python -m sgl_adaspec.bench.sglang_serving [--model-path M --draft D --device cpu ...]

For each configuration (`none`: no speculation; then each `--policies` entry, EAGLE with the
given shape) it starts one server with the same base flags, runs
`python -m sglang.benchmark.serving` (the tool behind `sglang.bench_serving`) on every dataset
and request rate, and keeps SGLang's JSONL result files under `--out`. Datasets, both offline:
`random-ids` (random token ids) and `spec-bench` (the shipped Spec-Bench questions, written in
ShareGPT's format for SGLang's `--dataset-path`). Every request carries one SLO class through
`--extra-request-body '{"custom_params": {"slo_class": ...}}'`, so it goes over the
OpenAI-compatible completions endpoint (`--backend sglang-oai`), where SGLang reads top-level
`custom_params`. Prints a side-by-side table and, last, the worst ratio of a policy's median
TPOT to no speculation's over all datasets and rates (`<policy>_tpot_over_nospec_max=<x>`).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from sgl_adaspec.adapters.cli import check_policy_shape
from sgl_adaspec.config import ConfigError
from sgl_adaspec.data import SMOLLM2_EAGLE_DRAFT, SPEC_BENCH_QUESTIONS
from sgl_adaspec.flags import comma_floats
from sgl_adaspec.local_server.launch import CPU_FLAGS, Server, eagle_flags
from sgl_adaspec.scheduler.slo_config import DEFAULT_SLO_CONFIG, load_slo_config

DATASETS = ("random-ids", "spec-bench")
# SGLang's result fields shown in the table, with their column titles.
COLUMNS = (
    ("median_tpot_ms", "TPOT p50"), ("p99_tpot_ms", "TPOT p99"), ("median_itl_ms", "ITL p50"),
    ("p99_itl_ms", "ITL p99"), ("output_throughput", "out tok/s"), ("accept_length", "accept"),
)  # fmt: skip


@dataclass(frozen=True)
class ServingBench:
    model_path: Path
    draft: Path
    device: str
    steps: int
    topk: int
    draft_tokens: int
    policies: tuple[str, ...]
    rates: tuple[float, ...]
    num_prompts: int
    input_len: int
    output_len: int
    slo_class: str
    out: Path

    def __post_init__(self) -> None:
        """Every input checked before a server starts (ValueError naming it): the launcher's own
        checks of each policy against the draft's shape, the SLO class against the classes
        the servers serve by, and local paths that must exist."""
        for name, path in (("--model-path", self.model_path), ("--draft", self.draft)):
            # A hub id ("org/model") is SGLang's to resolve; a local path must be there.
            text = str(path)
            if not Path(path).exists() and (Path(path).is_absolute() or text.startswith(".")):
                raise ValueError(f"{name} {text}: no such folder")
        if not self.policies:
            raise ValueError("--policies names no policy")
        for policy in self.policies:
            try:
                check_policy_shape(policy, self.steps, self.topk, self.draft_tokens)
            except ConfigError as exc:
                raise ValueError(f"--policies {policy}: {exc}") from exc
        for name, value in (("--num-prompts", self.num_prompts), ("--input-len", self.input_len),
                            ("--output-len", self.output_len), ("--spec-steps", self.steps)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if not self.rates or not all(0 < rate < math.inf for rate in self.rates):
            raise ValueError(f"--rates must be request rates > 0, got {self.rates}")
        classes = load_slo_config(DEFAULT_SLO_CONFIG).classes
        if self.slo_class not in classes:
            raise ValueError(
                f"--slo-class {self.slo_class!r} is not a class the servers serve by "
                f"({', '.join(classes)})"
            )

    def server_flags(self, policy: str) -> tuple[str, ...]:
        base = CPU_FLAGS if self.device == "cpu" else ("--device", self.device)
        if policy == "none":
            return base
        shape = eagle_flags(self.draft, self.steps, self.topk, self.draft_tokens)
        return (*base, *shape, "--spec-policy", policy)


def spec_bench_sharegpt(questions: Path, out: Path) -> Path:
    """The questions' first turns as ShareGPT conversations (the answer is unused: the output
    length is fixed by `--sharegpt-output-len`)."""
    rows = []
    for line in questions.read_text().splitlines():
        if line.strip():
            turn = json.loads(line)["turns"][0]
            rows.append({"conversations": [{"from": "human", "value": turn},
                                           {"from": "gpt", "value": "-"}]})  # fmt: skip
    out.write_text(json.dumps(rows))
    return out


def bench_command(
    bench: ServingBench, url: str, dataset: str, rate: float, result: Path, sharegpt: Path
) -> list[str]:
    """`python -m sglang.benchmark.serving` for one dataset and rate, SGLang's flags only."""
    if dataset == "random-ids":
        data = ["--dataset-name", "random-ids", "--random-input-len", str(bench.input_len),
                "--random-output-len", str(bench.output_len),
                "--random-range-ratio", "1.0"]  # fmt: skip
    else:
        data = ["--dataset-name", "sharegpt", "--dataset-path", str(sharegpt),
                "--sharegpt-output-len", str(bench.output_len),
                "--sharegpt-context-len", str(4 * bench.input_len)]  # fmt: skip
    return [
        sys.executable, "-m", "sglang.benchmark.serving",
        "--backend", "sglang-oai", "--base-url", url,
        "--model", str(bench.model_path), "--tokenizer", str(bench.model_path),
        *data, "--num-prompts", str(bench.num_prompts), "--request-rate", str(rate),
        "--extra-request-body", json.dumps({"custom_params": {"slo_class": bench.slo_class}}),
        "--output-file", str(result), "--seed", "1", "--disable-tqdm",
    ]  # fmt: skip


def last_result(path: Path) -> dict:
    """The last JSON line SGLang appended to its output file."""
    return json.loads(path.read_text().strip().splitlines()[-1])


def run(bench: ServingBench) -> dict[tuple[str, str, float], dict]:
    bench.out.mkdir(parents=True, exist_ok=True)
    sharegpt = spec_bench_sharegpt(SPEC_BENCH_QUESTIONS, bench.out / "spec_bench_sharegpt.json")
    results = {}
    for policy in ("none", *bench.policies):
        log = bench.out / f"server-{policy}.log"
        server = Server(bench.model_path, base_flags=bench.server_flags(policy), log_path=log)
        print(f"[{policy}] starting server (log {log})", flush=True)
        server.start()
        try:
            for dataset in DATASETS:
                for rate in bench.rates:
                    result = bench.out / f"{policy}_{dataset}_rate{rate:g}.jsonl"
                    result.unlink(missing_ok=True)
                    cmd = bench_command(bench, server.url, dataset, rate, result, sharegpt)
                    print(f"[{policy}] {dataset} at {rate:g} req/s", flush=True)
                    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
                    results[(policy, dataset, rate)] = last_result(result)
        finally:
            server.stop()
    return results


def report(bench: ServingBench, results: dict[tuple[str, str, float], dict]) -> list[str]:
    """The table's lines, then one figure line per policy; the last line is the last policy's."""
    head = f"{'config':<10} {'dataset':<11} {'req/s':>5} " + " ".join(
        f"{title:>10}" for _, title in COLUMNS
    )
    lines = [head]
    for (policy, dataset, rate), row in results.items():
        cells = " ".join(
            f"{row[key]:>10.2f}" if row.get(key) is not None else f"{'-':>10}"
            for key, _ in COLUMNS
        )
        lines.append(f"{policy:<10} {dataset:<11} {rate:>5g} {cells}")
    for policy in bench.policies:
        ratios = [
            results[(policy, d, r)]["median_tpot_ms"] / results[("none", d, r)]["median_tpot_ms"]
            for d in DATASETS
            for r in bench.rates
        ]
        lines.append(f"{policy}_tpot_over_nospec_max={max(ratios):.3f}")
    return lines


def parse_args(argv: list[str] | None = None) -> ServingBench:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-path", type=Path, help="target (default: SmolLM2-135M-Instruct)")
    p.add_argument("--draft", type=Path, default=SMOLLM2_EAGLE_DRAFT)
    p.add_argument("--device", default="cpu", help="cpu (the CPU recipe) or e.g. cuda")
    p.add_argument("--spec-steps", type=int, default=4)
    p.add_argument("--spec-topk", type=int, default=2)
    p.add_argument("--spec-draft-tokens", type=int, default=8)
    p.add_argument("--policies", default="adaserve", help="comma-separated --spec-policy values")
    p.add_argument(
        "--rates", type=comma_floats, default=(0.5, 2.0), help="comma-separated request rates"
    )
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--input-len", type=int, default=128, help="random-ids prompt tokens")
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--slo-class", default="coding", help="SLO class of every request")
    p.add_argument("--out", type=Path, default=Path("bench-serving-out"))
    args = p.parse_args(argv)
    if args.model_path is None:
        from sgl_adaspec.models.smollm2 import prepare_smollm2

        args.model_path = prepare_smollm2()
    try:
        return ServingBench(
            model_path=args.model_path, draft=args.draft, device=args.device,
            steps=args.spec_steps, topk=args.spec_topk, draft_tokens=args.spec_draft_tokens,
            policies=tuple(p for p in args.policies.split(",") if p), rates=args.rates,
            num_prompts=args.num_prompts, input_len=args.input_len, output_len=args.output_len,
            slo_class=args.slo_class, out=args.out,
        )  # fmt: skip
    except ValueError as exc:
        p.error(str(exc))


def main(argv: list[str] | None = None) -> None:
    bench = parse_args(argv)
    summary = "\n".join(report(bench, run(bench)))
    (bench.out / "summary.txt").write_text(summary + "\n")
    print(summary)


if __name__ == "__main__":
    main()
