"""The hook table (`adapters/hook_table.py`): every entry names a real SGLang function and a
real plugin function, every hook on a function SGLang calls inside a captured region is
declared there, the guard refuses the others inside one, and docs/architecture.md shows the
table as the code has it."""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from pathlib import Path

import pytest

from sgl_adaspec.adapters import hook_table
from sgl_adaspec.adapters.hook_table import HOOKS, CaptureSafetyError, Hook, guarded
from sgl_adaspec.adapters.platform.cpu.graph_emulation import _sealed_region

DOCS = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
# The callables SGLang captures as graphs on CUDA: the EAGLE draft, and the model forward
# (decode and verify graphs).
CAPTURED_ROOTS = (
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.draft_forward",
    "sglang.srt.models.llama.LlamaModel.forward",
)


def resolve(dotted: str):
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


@pytest.mark.parametrize("hook", HOOKS, ids=lambda hook: hook.target.rsplit(".", 2)[-2:][-1])
def test_every_entry_names_real_functions(hook: Hook):
    assert hook.why and hook.kind in ("before", "after", "around", "replace")
    if hook.kind == "replace":  # an object SGLang calls methods on; a class stands in
        replaced = resolve(hook.target)
        methods = [
            n for n in dir(replaced) if not n.startswith("_") and callable(getattr(replaced, n))
        ]
        assert methods and all(callable(getattr(hook.function(), m, None)) for m in methods)
        return
    assert callable(resolve(hook.target)), hook.target
    assert callable(hook.function()), hook.hook


def test_targets_are_hooked_once():
    targets = [hook.target for hook in HOOKS]
    assert len(targets) == len(set(targets))


def _called_in(function, depth: int, seen: set) -> set:
    """Qualified names of the SGLang functions `function` calls, `depth` calls deep (names and
    `self.` methods resolved in its module and class)."""
    function = inspect.unwrap(getattr(function, "_torchdynamo_orig_callable", function))
    key = f"{function.__module__}.{function.__qualname__}"
    if depth == 0 or key in seen or not function.__module__.startswith("sglang"):
        return set()
    seen.add(key)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError):
        return {key}
    module = inspect.getmodule(function)
    owner = resolve(key.rsplit(".", 1)[0]) if "." in function.__qualname__ else None
    found = {key}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        callee = None
        if isinstance(node.func, ast.Name):
            callee = getattr(module, node.func.id, None)
        elif (
            isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "self"
            and owner is not None
        ):
            callee = getattr(owner, node.func.attr, None)
        if inspect.isfunction(callee) or hasattr(callee, "_torchdynamo_orig_callable"):
            found |= _called_in(callee, depth - 1, seen)
    return found


def test_every_hook_inside_a_captured_region_is_declared_capture_safe():
    captured = set()
    for root in CAPTURED_ROOTS:
        captured |= _called_in(resolve(root), depth=4, seen=set())
    assert "sglang.srt.speculative.eagle_utils.organize_draft_results" in captured
    hooked = {}
    for hook in (hook for hook in HOOKS if hook.kind != "replace"):
        function = inspect.unwrap(resolve(hook.target))
        function = getattr(function, "_torchdynamo_orig_callable", function)
        hooked[f"{function.__module__}.{function.__qualname__}"] = hook
    inside = {name: hooked[name] for name in captured if name in hooked}
    assert {hook.target.rsplit(".", 1)[-1] for hook in inside.values()} >= {
        "draft_forward", "organize_draft_results", "forward",
    }  # fmt: skip
    undeclared = [hook.target for hook in inside.values() if not hook.captured]
    assert not undeclared, f"hooked inside a captured region, not declared: {undeclared}"


def test_the_guard_refuses_an_undeclared_hook_inside_a_captured_region():
    outside_only = Hook("sglang.x", "sgl_adaspec.adapters.hook_table:markdown", "after", "test")
    function = guarded(outside_only)
    assert function() == hook_table.markdown()  # outside: runs
    with _sealed_region(), pytest.raises(CaptureSafetyError, match="sglang.x"):
        function()
    target = "sgl_adaspec.adapters.hook_table:markdown"
    declared = Hook("sglang.x", target, "after", "test", captured=True)
    with _sealed_region():
        assert guarded(declared)() == hook_table.markdown()


def test_docs_show_the_table_as_the_code_has_it():
    assert hook_table.markdown() in DOCS.read_text(), (
        "regenerate the table in docs/architecture.md: python -m sgl_adaspec.adapters.hook_table"
    )
