"""`sglang.Engine` (in-process API) with the plugin: per-request SLOs are accepted and bad ones
raise an exception naming the field; EAGLE on CPU serves through the same torch path; and
`sgl_adaspec.Engine` takes the plugin's flags as keywords (a policy chosen in-process).

The Engine runs in a child interpreter: its shutdown kills every child process of the process
that created it, which inside pytest would include the other tests' servers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

ENGINE_CHECK = textwrap.dedent(
    """
    import sys
    import sglang
    from sgl_adaspec import Engine

    target, draft, policy = sys.argv[1], sys.argv[2], sys.argv[3]
    engine = (sglang.Engine if policy == "none" else Engine)(
        **({} if policy == "none" else {"spec_policy": policy}),
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
        (state,) = engine.get_server_info()["internal_states"]
        expected = "static" if policy == "none" else policy
        assert state["adaspec"]["spec_policy"] == expected, state["adaspec"]
        if policy != "none":
            assert state["adaspec"]["stats"]["iterations"] > 0, state["adaspec"]
        print("ENGINE_OUTPUT", ok["output_ids"])
        print("ENGINE_CHECK_OK")
    finally:
        engine.shutdown()
    """
)


def without_plugin_config() -> dict:
    """This process's environment less a plugin config another test may have left in it: an
    engine of `sglang.Engine` (no command line) would serve by it."""
    return {key: value for key, value in os.environ.items() if key != "ADASPEC_CONFIG"}


def engine_output(models, policy: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", ENGINE_CHECK, str(models.target), str(models.eagle_draft), policy],
        capture_output=True,
        text=True,
        timeout=600,
        env=without_plugin_config(),
    )
    assert result.returncode == 0 and "ENGINE_CHECK_OK" in result.stdout, (
        result.stdout[-2000:] + result.stderr[-4000:]
    )
    return next(line for line in result.stdout.splitlines() if line.startswith("ENGINE_OUTPUT"))


@pytest.mark.slow
def test_engine_generate_validates_custom_params(models):
    engine_output(models, "none")


@pytest.mark.slow
def test_the_plugins_engine_serves_a_policy_chosen_in_process(models):
    # adaserve through `sgl_adaspec.Engine`, greedy: the same tokens as SGLang's Engine.
    assert engine_output(models, "adaserve") == engine_output(models, "none")


ENGINE_REFUSES = """
import os, sys
from sgl_adaspec.config import ConfigError
from sgl_adaspec import Engine
target, draft = sys.argv[1], sys.argv[2]
for kwargs in ({"spec_policy": "fastest"}, {"spec_policy": "adaserve"},
               {"spec_policy": "tetris", "speculative_algorithm": "EAGLE",
                "speculative_num_steps": 3}):
    try:
        Engine(model_path="/nonexistent/model", **kwargs)
    except ConfigError as exc:
        print("REFUSED", exc)
print("PUBLISHED", "ADASPEC_CONFIG" in os.environ)
try:  # no shape flag: SGLang chooses a width-1 chain for a STANDALONE draft, before any load
    Engine(model_path=target, speculative_algorithm="STANDALONE",
           speculative_draft_model_path=draft, spec_policy="adaserve", device="cpu")
except ConfigError as exc:
    print("REFUSED", exc)
"""


def test_the_plugins_engine_refuses_bad_plugin_flags_before_starting(models):
    result = subprocess.run(
        [sys.executable, "-c", ENGINE_REFUSES, str(models.target), str(models.standalone_draft)],
        capture_output=True, text=True, timeout=300, env=without_plugin_config(),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    refused = [line for line in result.stdout.splitlines() if line.startswith("REFUSED")]
    assert len(refused) == 4, result.stdout
    assert "unknown --spec-policy 'fastest'" in refused[0]
    assert "--spec-policy adaserve needs --speculative-algorithm" in refused[1]
    assert "got --speculative-num-steps 3 without" in refused[2]
    assert "PUBLISHED False" in result.stdout  # nothing reached the processes it would start
    assert "SGLang chose --speculative-num-steps 3 --speculative-eagle-topk 1" in refused[3]
    assert "Load weight" not in result.stderr
