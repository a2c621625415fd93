"""Builds the plugin's wheel from a copy of the sources, as a user's `pip wheel` would."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def build_wheel(root: Path) -> Path:
    """The wheel of a copy of the sources under `root` (no build folder in the checkout)."""
    source = root / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(
        REPO / "sgl_adaspec", source / "sgl_adaspec",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )  # fmt: skip
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-q", "-w", str(root / "dist"), str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (root / "dist").glob("sgl_adaspec-*.whl")
    return wheel
