"""The built wheel installed as a user installs it, in a fresh virtual environment outside the
checkout: the tiny demo runs from there with the plugin, its data and its defaults all read
from the installed package. SGLang and torch come from the project's environment (a path line,
so its editable install of the plugin is not seen)."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
from wheels import build_wheel


def fresh_venv(root: Path) -> Path:
    """A venv whose own site-packages comes first, then the project environment's packages."""
    env = root / "venv"
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    deps = sysconfig.get_paths()["purelib"]
    (Path(site) / "project_deps.pth").write_text(
        f"{deps}\nimport sgl_adaspec.adapters.platform.torchvision_stub as s; s.install()\n"
    )
    return python


@pytest.mark.slow
def test_the_installed_wheel_runs_the_demo_outside_the_checkout(tmp_path):
    wheel = build_wheel(tmp_path)
    python = fresh_venv(tmp_path)
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "--disable-pip-version-check", "-q", str(wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-2000:]
    where = subprocess.run(
        [str(python), "-c", "import sgl_adaspec.data as d; print(d.__file__); "
         "print(d.SMOLLM2_EAGLE_DRAFT.is_dir())"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    package, draft_shipped = where.stdout.split()
    assert Path(package).is_relative_to(tmp_path / "venv") and draft_shipped == "True"
    demo = subprocess.run(
        [str(python), "-m", "sgl_adaspec.demo", "--tiny"],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert demo.stdout.strip().splitlines()[-1].startswith("slo_attainment=")
