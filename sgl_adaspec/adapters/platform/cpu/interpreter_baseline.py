"""SGLang's own speculative kernels on CPU through the Triton interpreter: a measurement baseline.

`benchmarks/cpu_spec_speed.py` compares the plugin's torch CPU path against this route. It is
selected with `ADASPEC_CPU_PATH=triton-interpreter` (plus `TRITON_INTERPRET=1` and
`--attention-backend triton`) and is not meant for serving: it runs at a few tokens/s.
SGLang picks its Triton branch of the speculative kernels only on XPU, so this sets that module
flag in the two kernel modules EAGLE uses; the plugin's own torch ops are then not registered.
"""

from __future__ import annotations

import os

CPU_PATH_ENV = "ADASPEC_CPU_PATH"
INTERPRETER = "triton-interpreter"


def requested() -> bool:
    return os.environ.get(CPU_PATH_ENV, "") == INTERPRETER


def enable() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"{CPU_PATH_ENV}={INTERPRETER} needs TRITON_INTERPRET=1")
    from sglang.kernels.ops.speculative import cache_locs, spec_tree

    for module in (spec_tree, cache_locs):
        module._is_xpu = True
