"""``python -m sgl_adaspec.bench``: replay a workload against SGLang servers and compare policies.

Examples (docs/evaluation.md has more):

    # start servers one policy after another (tiny CPU models when --model is not given)
    python -m sgl_adaspec.bench --synthetic poisson --num-requests 8 --request-rate 2 \\
        --output-tokens 16 --policies none,adaserve --out bench_out

    # replay an AdaServe trace against servers that are already running
    python -m sgl_adaspec.bench --trace adaserve_rps3.0_ol256.json --num-requests 200 \\
        --server static=http://127.0.0.1:30000 --server adaserve=http://127.0.0.1:30001 \\
        --baseline-tpot-ms 25 --out bench_out

Prints the tables, then ``attainment_<label>=<x>`` lines and, last, ``best_attainment_policy=``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import requests

from sgl_adaspec.bench.http_stream import APIS
from sgl_adaspec.bench.policies import LAUNCH_RECIPES, SpecShape
from sgl_adaspec.bench.replay import SLO_FIELDS
from sgl_adaspec.bench.report import render, write_json
from sgl_adaspec.bench.runner import BenchConfig, BenchError, ServerSettings, run_bench
from sgl_adaspec.bench.traces import TRACE_FORMATS
from sgl_adaspec.bench.workloads import WorkloadSpec, parse_class_mix
from sgl_adaspec.config import ConfigError

W, S, B, SH = WorkloadSpec, ServerSettings, BenchConfig, SpecShape  # defaults live there


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sgl_adaspec.bench",
        description="Replay a workload against SGLang servers (started here or running) and "
        "report per-request latency, SLO attainment and goodput per policy and SLO class.",
    )
    wl = parser.add_argument_group("workload")
    source = wl.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", type=Path, help="AdaServe JSON, Azure CSV or timestamp CSV")
    source.add_argument("--synthetic", choices=("poisson", "gamma"), help="synthetic arrivals")
    wl.add_argument("--trace-format", choices=("auto", *TRACE_FORMATS), default=W.trace_format)
    wl.add_argument("--gamma-cv", type=float, default=W.gamma_cv, help="gamma arrivals' CV")
    wl.add_argument("--num-requests", type=int, help="first N of the trace / N synthetic")
    wl.add_argument("--prompts", type=Path, help="Spec-Bench question.jsonl (default: built-in)")
    wl.add_argument("--input-tokens", type=int, help="prompt length for traces without counts")
    wl.add_argument("--output-tokens", type=int, default=W.output_tokens,
                    help="tokens to generate for traces without counts")  # fmt: skip
    wl.add_argument("--max-input-tokens", type=int, help="cut longer prompts to this")
    wl.add_argument("--max-output-tokens", type=int, help="cap generated tokens")
    wl.add_argument(
        "--class-mix",
        help="e.g. coding=0.6,chat=0.2,summarization=0.2 (default: the trace's SLOs for "
        "AdaServe traces, else equal weights over the SLO config's classes)",
    )
    wl.add_argument("--seed", type=int, default=W.seed)
    wl.add_argument(
        "--request-rate", type=float, nargs="+", default=list(B.request_rates_per_s),
        help="rescale arrivals to these mean rates, req/s (default: the trace's)",
    )  # fmt: skip

    slo = parser.add_argument_group("SLOs")
    slo.add_argument("--slo-config", type=Path, default=B.slo_config_path)
    slo.add_argument("--slo-scale", type=float, default=B.slo_scale,
                     help="multiply every TPOT SLO by this")  # fmt: skip
    slo.add_argument("--baseline-tpot-ms", type=float,
                     help="baseline TPOT for relative classes (default: measured)")  # fmt: skip
    slo.add_argument("--baseline-url", help="running server without speculation to measure it on")
    slo.add_argument(
        "--slo-field", choices=SLO_FIELDS, default=B.slo_field,
        help="what custom_params carries: the resolved TPOT or the class name",
    )  # fmt: skip
    slo.add_argument(
        "--ttft-slo-ms", type=parse_ttft_slos, default=(), metavar="CLASS=MS,...",
        help="per-class TTFT SLOs sent as custom_params.ttft_slo_ms (SLO-aware admission)",
    )  # fmt: skip

    srv = parser.add_argument_group("servers")
    srv.add_argument(
        "--policies", type=_names,
        help=f"start a server per policy, in this order; from: {', '.join(LAUNCH_RECIPES)}",
    )  # fmt: skip
    srv.add_argument(
        "--server", action="append", default=[], type=_labelled_url, metavar="LABEL=URL",
        help="a running server to replay against (repeatable)",
    )  # fmt: skip
    srv.add_argument("--model", type=Path, help="target model (default: the tiny test model)")
    srv.add_argument("--draft-model", type=Path, help="EAGLE draft (default: the tiny one)")
    srv.add_argument("--tokenizer", type=Path, help="for length matching (default: --model)")
    srv.add_argument("--device", choices=("cpu", "cuda"), default=S.device)
    srv.add_argument("--spec-steps", type=int, default=SH.steps)
    srv.add_argument("--spec-topk", type=int, default=SH.topk)
    srv.add_argument("--spec-draft-tokens", type=int, default=SH.num_draft_tokens)
    srv.add_argument("--server-args", default="", help="extra flags for every started server")
    srv.add_argument("--startup-timeout-s", type=float, default=S.startup_timeout_s)

    run = parser.add_argument_group("replay and output")
    run.add_argument("--api", choices=APIS, default=B.api)
    run.add_argument("--request-timeout-s", type=float, default=B.request_timeout_s)
    run.add_argument("--out", type=Path, required=True, help="directory for JSON, PNGs, logs")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def parse_ttft_slos(text: str) -> tuple[tuple[str, float], ...]:
    pairs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        try:
            pairs.append((name.strip(), float(value)))
        except ValueError:
            sep = ""
        if not sep or not name.strip():
            raise argparse.ArgumentTypeError(f"expected CLASS=MS, got {item!r}")
    return tuple(pairs)


def _names(text: str) -> tuple[str, ...]:
    return tuple(filter(None, (name.strip() for name in text.split(","))))


def _labelled_url(text: str) -> tuple[str, str]:
    label, sep, url = text.partition("=")
    if not sep or not label or not url.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"expected LABEL=http://HOST:PORT, got {text!r}")
    return label, url.rstrip("/")


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    model, draft = args.model, args.draft_model
    if args.policies and model is None:
        from sgl_adaspec.models.tiny import ensure_models  # builds them offline, seconds

        tiny = ensure_models()
        model, draft = tiny.target, draft or tiny.eagle_draft
    workload = WorkloadSpec(
        trace_path=args.trace, trace_format=args.trace_format, synthetic=args.synthetic,
        gamma_cv=args.gamma_cv, num_requests=args.num_requests, prompts_path=args.prompts,
        input_tokens=args.input_tokens, output_tokens=args.output_tokens,
        max_input_tokens=args.max_input_tokens, max_output_tokens=args.max_output_tokens,
        class_mix=parse_class_mix(args.class_mix) if args.class_mix else None, seed=args.seed,
    )  # fmt: skip
    servers = ServerSettings(
        model=model, draft_model=draft, device=args.device,
        shape=SpecShape(args.spec_steps, args.spec_topk, args.spec_draft_tokens),
        extra_args=tuple(shlex.split(args.server_args)), startup_timeout_s=args.startup_timeout_s,
    )  # fmt: skip
    return BenchConfig(
        workload=workload, out_dir=args.out, policies=args.policies or (),
        external=tuple(args.server), servers=servers,
        request_rates_per_s=tuple(args.request_rate), slo_config_path=args.slo_config,
        slo_scale=args.slo_scale, baseline_tpot_ms=args.baseline_tpot_ms,
        baseline_url=args.baseline_url, slo_field=args.slo_field,
        ttft_slo_ms=args.ttft_slo_ms, api=args.api,
        tokenizer=args.tokenizer, request_timeout_s=args.request_timeout_s,
        progress=not args.no_progress,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
        result = run_bench(config)
    except (BenchError, ConfigError, ValueError, requests.RequestException) as exc:
        print(f"sgl_adaspec.bench: error: {exc}", file=sys.stderr)
        return 2
    out = Path(config.out_dir)
    files = [write_json(result, out / "results.json")]
    try:  # the figures need matplotlib: `pip install sgl_adaspec[bench]`
        from sgl_adaspec.bench.plots import plot_load_sweep, plot_per_class
    except ImportError as exc:
        print(f"sgl_adaspec.bench: no figures ({exc}; pip install 'sgl_adaspec[bench]')")
    else:
        files += [
            plot_load_sweep(result, out / "load_sweep.png"),
            plot_per_class(result, out / "per_class.png"),
        ]
    print(render(result, files))
    return 0
