"""The plugin as a plain (non-editable) `pip install` leaves it: the wheel alone, no repository.

Whatever the plugin reads at run time (the default SLO classes above all: without them every
`sglang.launch_server` in the environment ends with "cannot read SLO config") must ship in the
wheel. Here the wheel is built from a copy of the sources, unpacked, and put first on the path,
and SGLang parses a launch with the plugin loaded from it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from wheels import build_wheel

# The launch the README shows, parsed as `python -m sglang.launch_server` parses it (plugins
# first); what the plugin then holds.
PARSE = """
import json, sys
import sgl_adaspec
from sglang.srt.plugins import load_plugins
from sglang.srt.server_args import prepare_server_args
from sgl_adaspec.config import AdaspecConfig
load_plugins()
prepare_server_args(sys.argv[1:])
config = AdaspecConfig.from_env()
print(json.dumps({"package": sgl_adaspec.__file__, "version": sgl_adaspec.__version__,
                  "policy": config.spec_policy,
                  "classes": sorted(config.load_slo_config().classes)}))
"""


@pytest.fixture(scope="module")
def unpacked_wheel(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(root)
    site = root / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return site


def test_the_wheel_holds_the_data_the_plugin_reads_at_run_time(unpacked_wheel):
    data = unpacked_wheel / "sgl_adaspec"
    assert (data / "data" / "slo_classes.yaml").is_file()
    assert (data / "data" / "spec_bench_questions.jsonl").is_file()
    assert list((data / "sim" / "data").glob("*.json"))
    dist_info = next(unpacked_wheel.glob("sgl_adaspec-*.dist-info"))
    entry_points = (dist_info / "entry_points.txt").read_text()
    assert "sgl_adaspec = sgl_adaspec.adapters.plugin:register" in entry_points
    assert "Apache License" in next(dist_info.rglob("LICENSE")).read_text()
    metadata = (dist_info / "METADATA").read_text()
    assert "Provides-Extra: bench" in metadata and "extra == \"bench\"" in metadata


def test_a_plain_install_launches_with_its_default_slo_classes(unpacked_wheel, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(unpacked_wheel)}
    env.pop("ADASPEC_CONFIG", None)
    argv = [
        "--model-path", "/nonexistent/model", "--speculative-algorithm", "EAGLE",
        "--speculative-draft-model-path", "/nonexistent/draft", "--spec-policy", "adaserve",
    ]  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-c", PARSE, *argv],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    parsed = json.loads(result.stdout.splitlines()[-1])
    assert Path(parsed["package"]).is_relative_to(unpacked_wheel)  # not the checkout's copy
    assert parsed["policy"] == "adaserve"
    assert parsed["version"] == next(unpacked_wheel.glob("sgl_adaspec-*.dist-info")).stem.split("-")[1]
    assert parsed["classes"] == ["chat", "coding", "summarization"]


def test_another_sglang_is_refused_naming_both_versions_and_the_opt_out():
    from sgl_adaspec.adapters.plugin import SUPPORTED_SGLANG, check_sglang_version

    check_sglang_version(SUPPORTED_SGLANG)
    with pytest.raises(RuntimeError, match="sglang 0.5.24") as info:
        check_sglang_version("0.5.24")
    assert SUPPORTED_SGLANG in str(info.value) and "SGLANG_PLUGINS" in str(info.value)
