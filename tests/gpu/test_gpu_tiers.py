"""The GPU path on SGLang's CUDA backends (`make gpu-check`; skipped without CUDA): adaserve's
draft tiers as SGLang runtime states with their own captured graphs.

One server without speculation and one adaserve server with `--gpu-draft-tiers on`, SmolLM2 +
the committed draft in float32 (greedy outputs comparable token for token).
"""

from __future__ import annotations

import concurrent.futures

import pytest
import requests

from sgl_adaspec.local_server.client import generate
from sgl_adaspec.local_server.launch import Server, eagle_flags

pytestmark = pytest.mark.gpu

GPU_FLAGS = (
    "--device", "cuda", "--attention-backend", "triton", "--dtype", "float32",
    "--mem-fraction-static", "0.3", "--max-running-requests", "16",
)  # fmt: skip
PROMPTS = [f"Write a Python function number {i} that" for i in range(12)]
TOKENS = 48
READY_LINE = "The server is fired up"


@pytest.fixture(scope="module")
def smollm2():
    from sgl_adaspec.models.smollm2 import prepare_smollm2
    from sgl_adaspec.models.train_eagle import DEFAULT_EXPORT

    return prepare_smollm2(), DEFAULT_EXPORT


def outputs_at_once(url: str, prompts: list[str]) -> list[list[int]]:
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda p: generate(url, p, TOKENS)["output_ids"], prompts))


def serve(model, extra, tmp_path, name) -> tuple[list[list[int]], dict | None, str]:
    """Greedy outputs at loads 1, 4 and 12 (the tiers switch with the load), the plugin's
    statistics and the server log."""
    server = Server(model, extra, base_flags=GPU_FLAGS, log_path=tmp_path / f"{name}.log")
    with server:
        outputs = [generate(server.url, PROMPTS[0], TOKENS)["output_ids"]]
        outputs += outputs_at_once(server.url, PROMPTS[:4])
        outputs += outputs_at_once(server.url, PROMPTS)
        info = requests.get(f"{server.url}/server_info", timeout=60).json()
    state = info["internal_states"][0].get("adaspec")
    return outputs, state["stats"] if state else None, server.log_path.read_text()


def test_tiers_on_cuda_are_lossless_replay_graphs_and_capture_only_at_start(smollm2, tmp_path):
    target, draft = smollm2
    expected, _, _ = serve(target, (), tmp_path, "plain")
    flags = (*eagle_flags(draft, 4, 4, 8), "--spec-policy", "adaserve", "--gpu-draft-tiers", "on")
    outputs, stats, log = serve(target, flags, tmp_path, "tiers")
    assert "sgl_adaspec: draft tiers CUDA graphs per tier" in log
    assert outputs == expected
    # Several tiers ran, and the tiered drafts replayed their graphs.
    assert len(stats["draft_iterations_by_shape"]) >= 2, stats["draft_iterations_by_shape"]
    assert stats["draft_graph_replays"] > 0
    # No graph was captured after start-up.
    after = log.split(READY_LINE, 1)[1]
    assert not [line for line in after.splitlines() if "capture" in line.lower()]
