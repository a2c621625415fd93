"""Run a real Prometheus against a real sgl_adaspec server and check what it records.

    .venv/bin/python scripts/prometheus_check.py

Needs `prometheus` and `promtool` on PATH (Debian/Ubuntu: `apt-get install -y prometheus`).
Steps: build the tiny offline models; start SGLang on CPU with the plugin (EAGLE,
`--spec-policy adaserve --enable-metrics`); check docker/prometheus/prometheus.yml and
docker/prometheus/rules.yml with promtool; start Prometheus on a free port with a temporary
storage folder and a copy of prometheus.yml that scrapes this server every second and
evaluates docker/prometheus/rules.yml (unchanged) every second; send two rounds of requests,
one per SLO class; then query Prometheus's HTTP API and assert that

* the target is up and every raw series the rules read exists,
* the per-class series carry `slo_class` with every class sent,
* every rule in rules.yml is healthy and returns data (per-class rules: every class sent),
* every query of docker/grafana/dashboard.json returns data.

Prints what it found; last line `prometheus_recorded_series=<count>` (the series the recording
rules returned). Stops Prometheus and the server; exit status 1 on a failed check.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import requests
import yaml

from sgl_adaspec.local_server import client
from sgl_adaspec.local_server.launch import Server, eagle_flags, free_port
from sgl_adaspec.models.tiny import ensure_models

REPO = Path(__file__).resolve().parents[1]
PROMETHEUS_YML = REPO / "docker" / "prometheus" / "prometheus.yml"
RULES_YML = REPO / "docker" / "prometheus" / "rules.yml"
DASHBOARD = REPO / "docker" / "grafana" / "dashboard.json"

# One request per class and round: (custom_params, the slo_class it is counted under).
REQUESTS = (
    ({"slo_class": "chat"}, "chat"),
    ({"slo_class": "summarization"}, "summarization"),
    ({"tpot_slo_ms": 200}, "custom_le_200ms"),
    (None, "best_effort"),
)
PROMPTS = ("def fibonacci(n):", "import os\nimport sys\n\n", "class Stack:", "for i in range(10):")
# The raw series the rules read, and their slo_class label: "every" class sent, "some" classes
# (requests_slo_met_total only counts classes that met their SLO at least once: on CPU the tiny
# model misses chat's 50 ms and summarization's 150 ms, and the rules count them as 0), or none.
RAW_SERIES = {
    "sglang_adaspec:requests_finished_total": "every",
    "sglang_adaspec:requests_slo_met_total": "some",
    "sglang_adaspec:request_tpot_ms_bucket": "every",
    "sglang_adaspec:request_tpot_ms_sum": "every",
    "sglang_adaspec:request_tpot_ms_count": "every",
    "sglang_adaspec:accepted_tokens_total": None,
    "sglang_adaspec:request_verifies_total": None,
    "sglang_adaspec:verified_tokens_per_iteration_bucket": None,
    "sglang_adaspec:verified_tokens_per_iteration_sum": None,
    "sglang_adaspec:verified_tokens_per_iteration_count": None,
    "sglang_adaspec:plain_iterations_total": None,
    "sglang_adaspec:iteration_shape": None,
    "sglang:request_time_per_output_token_seconds_bucket": None,
}
SCRAPE_S = 1


class CheckFailed(AssertionError):
    pass


def check(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def binary(name: str) -> str:
    path = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if path is None:
        sys.exit(
            f"prometheus_check: `{name}` not found (Debian/Ubuntu: apt-get install -y prometheus)"
        )
    return path


def run_promtool(promtool: str, *args: str) -> None:
    result = subprocess.run([promtool, *args], capture_output=True, text=True, check=False)
    output = (result.stdout + result.stderr).strip()
    print(f"$ promtool {' '.join(args)}\n" + "\n".join(f"  {line}" for line in output.splitlines()))
    check(result.returncode == 0, f"promtool {args[0]} {args[1]} failed ({result.returncode})")


def scrape_config(server: Server, rules: Path) -> dict:
    """docker/prometheus/prometheus.yml, pointed at `server`, with 1 s intervals."""
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    config["global"].update(scrape_interval=f"{SCRAPE_S}s", evaluation_interval=f"{SCRAPE_S}s")
    config["rule_files"] = [str(rules)]
    (job,) = config["scrape_configs"]
    job["static_configs"] = [{"targets": [f"127.0.0.1:{server.port}"]}]
    return config


class Prometheus:
    def __init__(self, binary_path: str, config: Path, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "prometheus.log"
        self.command = [
            binary_path,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60) -> None:
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            check(self.process.poll() is None, f"prometheus exited: {self.log_tail()}")
            try:
                if requests.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise CheckFailed(f"prometheus not ready after {timeout_s} s: {self.log_tail()}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def log_tail(self) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-20:])

    def api(self, path: str, **params) -> dict:
        response = requests.get(f"{self.url}/api/v1/{path}", params=params, timeout=30)
        body = response.json()
        check(body.get("status") == "success", f"/api/v1/{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["result"]


def rule_selector(rule: dict) -> str:
    labels = ",".join(f'{key}="{value}"' for key, value in sorted(rule.get("labels", {}).items()))
    return f"{rule['record']}{{{labels}}}" if labels else rule["record"]


def dashboard_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        if "expr" in target
    ]


def describe(series: dict) -> str:
    labels = {k: v for k, v in series["metric"].items() if k not in ("__name__", "job", "instance")}
    value = float(series["value"][1])
    text = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    return f"{{{text}}}={value:.4g}" if text else f"{value:.4g}"


def send_round(server: Server, max_new_tokens: int) -> None:
    def one(job):
        (params, _), prompt = job
        return client.generate(server.url, prompt, max_new_tokens, params, ignore_eos=True)

    with concurrent.futures.ThreadPoolExecutor(len(REQUESTS)) as pool:
        for out in pool.map(one, zip(REQUESTS, PROMPTS)):
            check(out["meta_info"]["completion_tokens"] == max_new_tokens, f"short output: {out}")


def wait_for_scrape(prom: Prometheus, expr: str, predicate, timeout_s: float = 60) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        result = prom.query(expr)
        if predicate(result):
            return result
        check(time.monotonic() < deadline, f"timed out waiting for {expr}: {result}")
        time.sleep(SCRAPE_S / 2)


def finished_total(result: list[dict]) -> float:
    return sum(float(series["value"][1]) for series in result)


def run_checks(prom: Prometheus, server: Server, rules: dict, max_new_tokens: int) -> int:
    classes = sorted({cls for _, cls in REQUESTS})
    finished = "sglang_adaspec:requests_finished_total"

    wait_for_scrape(prom, "up", lambda r: any(s["value"][1] == "1" for s in r))
    print(f"target up: {server.url}/metrics scraped every {SCRAPE_S} s")
    # Round 1 creates the per-class series; round 2 after a scrape of round 1 makes their rates
    # (5 m windows) positive.
    for round_ in (1, 2):
        send_round(server, max_new_tokens)
        want = round_ * len(REQUESTS)
        wait_for_scrape(prom, finished, lambda r, want=want: finished_total(r) >= want)
        print(f"round {round_}: {len(REQUESTS)} requests ({', '.join(classes)}) scraped")
    scraped_at = time.time()

    # Let the rules evaluate a couple of times after the last scrape.
    def evaluated() -> bool:
        groups = prom.api("rules", type="record")["groups"]
        return all(
            rule["lastEvaluation"] and _rfc3339(rule["lastEvaluation"]) > scraped_at + 2 * SCRAPE_S
            for group in groups
            for rule in group["rules"]
        )

    deadline = time.monotonic() + 60
    while not evaluated():
        check(time.monotonic() < deadline, "rules were not evaluated after the last scrape")
        time.sleep(SCRAPE_S / 2)

    print("\nraw series:")
    for name, class_label in RAW_SERIES.items():
        result = prom.query(name)
        check(result, f"raw series {name} missing")
        line = f"  {name}: {len(result)} series"
        if class_label:
            found = sorted({s["metric"].get("slo_class", "") for s in result})
            check("" not in found, f"{name}: a series without slo_class")
            want = classes if class_label == "every" else found
            check(set(want) <= set(found), f"{name}: slo_class {found}, want {want}")
            line += f", slo_class={','.join(found)}"
        elif name == "sglang_adaspec:iteration_shape":
            line += " " + " ".join(describe(s) for s in result)
        print(line)

    # prometheus.yml's metric_relabel_configs undo the exporter's `:` -> `_` escaping.
    names = prom.api("label/__name__/values")
    escaped = [n for n in names if n.startswith("sglang_") and ":" not in n]
    check(not escaped, f"escaped names stored (metric_relabel_configs not applied?): {escaped}")
    declared = [n for n in names if n.startswith(("sglang:", "sglang_adaspec:"))]
    print(f"  stored names: {len(declared)} sglang:*/sglang_adaspec:* names, none escaped")

    print("\nrecording rules (docker/prometheus/rules.yml):")
    health = {
        (rule["name"], json.dumps(rule.get("labels", {}), sort_keys=True)): rule
        for group in prom.api("rules", type="record")["groups"]
        for rule in group["rules"]
    }
    recorded = 0
    for group in rules["groups"]:
        for rule in group["rules"]:
            state = health[(rule["record"], json.dumps(rule.get("labels", {}), sort_keys=True))]
            check(state["health"] == "ok", f"{rule['record']}: {state.get('lastError')}")
            result = prom.query(rule_selector(rule))
            check(result, f"recording rule {rule_selector(rule)} returned no data")
            if "slo_class" in rule["expr"]:
                found = {s["metric"].get("slo_class") for s in result}
                check(set(classes) <= found, f"{rule['record']}: slo_class {found}")
            if "attainment" in rule["record"]:
                # Classes sent: a share in [0, 1]. Configured classes exist from start-up at 0,
                # so one no request named reads 0/0 = NaN.
                values = {s["metric"].get("slo_class"): float(s["value"][1]) for s in result}
                sent = [values[c] for c in classes]
                check(all(0 <= v <= 1 for v in sent), f"{rule['record']}: {values}")
                unsent = [v for c, v in values.items() if c not in classes]
                check(all(math.isnan(v) for v in unsent), f"{rule['record']}: {values}")
            recorded += len(result)
            print(f"  {rule_selector(rule)}: " + " ".join(describe(s) for s in result))

    print("\ngrafana dashboard queries (docker/grafana/dashboard.json):")
    for title, expr in dashboard_queries():
        result = prom.query(expr)
        check(result, f"dashboard panel {title!r}: {expr} returned no data")
        values = [float(s["value"][1]) for s in result]
        finite = sum(math.isfinite(v) for v in values)
        print(f"  {title}: {expr} -> {len(result)} series ({finite} finite)")
    return recorded


def _rfc3339(stamp: str) -> float:
    """Go's RFC 3339 with nanoseconds (`2026-01-02T03:04:05.123456789Z`) as a Unix time."""
    match = re.fullmatch(r"(.+T\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", stamp)
    check(match is not None, f"unexpected timestamp {stamp!r}")
    head, frac, zone = match.groups()
    zone = "+00:00" if zone == "Z" else zone
    return datetime.fromisoformat(head + zone).timestamp() + float(f"0.{frac or 0}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args()

    prometheus_bin, promtool = binary("prometheus"), binary("promtool")
    version = subprocess.run(
        [prometheus_bin, "--version"], capture_output=True, text=True, check=False
    )
    print((version.stdout or version.stderr).splitlines()[0])
    workdir = Path(tempfile.mkdtemp(prefix="prometheus_check_"))
    rules = yaml.safe_load(RULES_YML.read_text())
    run_promtool(promtool, "check", "rules", str(RULES_YML))
    run_promtool(promtool, "check", "config", str(PROMETHEUS_YML))

    models = ensure_models()
    flags = (*eagle_flags(models.eagle_draft), "--spec-policy", "adaserve", "--enable-metrics")
    server = Server(models.target, flags, log_path=workdir / "server.log")
    prom = None
    started = time.monotonic()
    try:
        server.start()
        print(f"server healthy after {time.monotonic() - started:.0f} s: {server.url}")
        config = workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(scrape_config(server, RULES_YML), sort_keys=False))
        run_promtool(promtool, "check", "config", str(config))
        prom = Prometheus(prometheus_bin, config, workdir)
        prom.start()
        print(f"prometheus ready: {prom.url} (storage {workdir / 'data'})")
        recorded = run_checks(prom, server, rules, args.max_new_tokens)
    except CheckFailed as exc:
        print(f"\nprometheus_check: FAILED: {exc}")
        if prom is not None:
            print("--- prometheus log tail ---\n" + prom.log_tail())
        return 1
    finally:
        if prom is not None:
            prom.stop()
        server.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print("\nall checks passed; prometheus and the server stopped")
    print(f"prometheus_recorded_series={recorded}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
