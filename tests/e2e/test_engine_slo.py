"""`sglang.Engine` (in-process API) with the plugin: per-request SLOs are accepted and bad ones
raise an exception naming the field; EAGLE on CPU serves through the same torch path.

The Engine runs in a child interpreter: its shutdown kills every child process of the process
that created it, which inside pytest would include the other tests' servers."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

ENGINE_CHECK = textwrap.dedent(
    """
    import sys
    import sglang

    target, draft = sys.argv[1], sys.argv[2]
    engine = sglang.Engine(
        model_path=target,
        speculative_algorithm="EAGLE",
        speculative_draft_model_path=draft,
        speculative_num_steps=3,
        speculative_eagle_topk=2,
        speculative_num_draft_tokens=6,
        device="cpu",
        attention_backend="torch_native",
        sampling_backend="pytorch",
        cuda_graph_backend_decode="disabled",
        cuda_graph_backend_prefill="disabled",
        dtype="float32",
        max_total_tokens=4096,
        max_running_requests=4,
    )
    try:
        params = {"temperature": 0, "max_new_tokens": 6}
        ok = engine.generate("def f(x):", {**params, "custom_params": {"slo_class": "chat"}})
        assert ok["meta_info"]["completion_tokens"] == 6, ok
        try:
            engine.generate("def f(x):", {**params, "custom_params": {"tpot_slo_ms": -1}})
        except ValueError as exc:
            assert "tpot_slo_ms must be > 0" in str(exc), exc
        else:
            raise AssertionError("a negative tpot_slo_ms was accepted")
        again = engine.generate("def f(x):", params)
        assert again["output_ids"] == ok["output_ids"]
        print("ENGINE_CHECK_OK")
    finally:
        engine.shutdown()
    """
)


@pytest.mark.slow
def test_engine_generate_validates_custom_params(models):
    result = subprocess.run(
        [sys.executable, "-c", ENGINE_CHECK, str(models.target), str(models.eagle_draft)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0 and "ENGINE_CHECK_OK" in result.stdout, (
        result.stdout[-2000:] + result.stderr[-4000:]
    )
