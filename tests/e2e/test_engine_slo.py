"""`sglang.Engine` (in-process API) with the plugin: per-request SLOs are accepted and bad ones
raise an exception naming the field; EAGLE on CPU serves through the same torch path."""

from __future__ import annotations

import pytest

CPU_ENGINE_ARGS = dict(
    device="cpu",
    attention_backend="torch_native",
    sampling_backend="pytorch",
    cuda_graph_backend_decode="disabled",
    cuda_graph_backend_prefill="disabled",
    dtype="float32",
    max_total_tokens=4096,
    max_running_requests=4,
)


@pytest.mark.slow
def test_engine_generate_validates_custom_params(models):
    import sglang

    engine = sglang.Engine(
        model_path=str(models.target),
        speculative_algorithm="EAGLE",
        speculative_draft_model_path=str(models.eagle_draft),
        speculative_num_steps=3,
        speculative_eagle_topk=2,
        speculative_num_draft_tokens=6,
        **CPU_ENGINE_ARGS,
    )
    try:
        params = {"temperature": 0, "max_new_tokens": 6}
        ok = engine.generate("def f(x):", {**params, "custom_params": {"slo_class": "chat"}})
        assert ok["meta_info"]["completion_tokens"] == 6
        with pytest.raises(ValueError, match="tpot_slo_ms must be > 0"):
            engine.generate("def f(x):", {**params, "custom_params": {"tpot_slo_ms": -1}})
        again = engine.generate("def f(x):", params)
        assert again["output_ids"] == ok["output_ids"]
    finally:
        engine.shutdown()
