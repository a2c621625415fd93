"""CPU enablement of SGLang speculative decoding (EAGLE / STANDALONE tree drafts).

SGLang 0.5.23 implements the speculative tree ops and tree attention only as CUDA/Triton kernels
(or the sgl-kernel CPU engine, not installable from PyPI). This package supplies pure-torch
versions and routes SGLang to them through hooks that check the tensors' device at call time:
on CUDA every hook falls through to SGLang's own code, so the package is inert there.

The pure-torch kernels (`tree_build`, `tree_verify`, `cache_slots`, `renorm`) each have the
signature and the in-place outputs of the SGLang function they stand in for (named in their
docstrings), and compute exactly what that kernel computes, so SGLang's callers cannot tell the
difference. They run on any device; the hooks use them on CPU only. Vocabulary (SGLang's): bs
requests; each verifies `ntok` = num_draft_tokens tree nodes, node 0 being the root (the last
committed, "bonus", token) and nodes 1..ntok-1 the draft tokens picked from the draft's beam
search; `topk` = beam width, `depth` = draft steps.

- `tree_build`: the verify tree's parents, attention mask, positions and sibling links.
- `tree_verify`: greedy tree verification and tree verification under sampling.
- `cache_slots`: KV-cache slot gathers and assignments, accepted-slot and bonus-token fills.
- `renorm`: top-k / top-p renormalization for the sampling verify.
- `attention`: tree attention for the target's verify pass and the draft's multi-branch decode.
- `hooks`: the registrations that route SGLang to the above.
"""
