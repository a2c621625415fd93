"""The boundary between the plugin's own logic and SGLang: every module that imports SGLang lives
under `sgl_adaspec/adapters/`, and within it the platform layer does not import the layers above
it. Static (every import statement, function bodies included) and at run time (importing the
pure packages loads no SGLang)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "sgl_adaspec"
ADAPTERS = PACKAGE / "adapters"
PLATFORM = ADAPTERS / "platform"
# What the pure side of the package offers; none of it may pull SGLang in.
PURE_MODULES = (
    "sgl_adaspec.speculative.driver",
    "sgl_adaspec.speculative.policies",
    "sgl_adaspec.speculative.adaserve.policy",
    "sgl_adaspec.scheduler.slo",
    "sgl_adaspec.scheduler.dp_dispatch",
    "sgl_adaspec.scheduler.replica_report",
    "sgl_adaspec.scheduler.slo_load",
    "sgl_adaspec.fleet.gateway",
    "sgl_adaspec.sim.engine",
    "sgl_adaspec.sim.policies",
    "sgl_adaspec.bench.runner",
    "sgl_adaspec.config",
)


def imported_modules(path: Path) -> set[str]:
    """Every module an import statement in `path` names (absolute names)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _modules(root: Path):
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def test_only_the_adapters_import_sglang():
    outside = {
        str(path.relative_to(PACKAGE.parent)): sorted(
            name for name in imported_modules(path) if name.split(".")[0] == "sglang"
        )
        for path in _modules(PACKAGE)
        if ADAPTERS not in path.parents
    }
    assert {path: names for path, names in outside.items() if names} == {}


def test_the_platform_layer_imports_nothing_above_it():
    above = {
        str(path.relative_to(PACKAGE.parent)): sorted(
            name
            for name in imported_modules(path)
            if name.startswith("sgl_adaspec.adapters.")
            and not name.startswith("sgl_adaspec.adapters.platform")
        )
        for path in _modules(PLATFORM)
    }
    assert {path: names for path, names in above.items() if names} == {}


def test_the_pure_packages_load_no_sglang():
    code = (
        "import importlib, sys\n"
        f"for name in {PURE_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m == 'sglang' or m.startswith('sglang.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_boundary_check_sees_an_import_inside_a_function(tmp_path):
    module = tmp_path / "late.py"
    module.write_text("def f():\n    from sglang.srt.utils import is_cpu\n    return is_cpu\n")
    assert "sglang.srt.utils" in imported_modules(module)
