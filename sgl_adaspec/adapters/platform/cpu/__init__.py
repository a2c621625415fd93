"""CPU enablement of SGLang speculative decoding (EAGLE / STANDALONE tree drafts).

SGLang 0.5.23 implements the speculative tree ops and tree attention only as CUDA/Triton kernels
(or the sgl-kernel CPU engine, not installable from PyPI). This package supplies pure-torch
versions and routes SGLang to them through hooks that check the tensors' device at call time:
on CUDA every hook falls through to SGLang's own code, so the package is inert there.

- `ops`: tree building, greedy tree verification, cache-location assignment (pure functions).
- `attention`: tree attention for the target's verify pass and the draft's multi-branch decode.
- `hooks`: the registrations that route SGLang to the above.
"""
