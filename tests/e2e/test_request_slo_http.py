"""Per-request SLOs over HTTP on a real server: accepted on every API, bad input gets HTTP 400
naming the field, and the server keeps serving."""

from __future__ import annotations

import subprocess
import sys

import pytest
import requests

BAD = [
    ({"tpot_slo_ms": -5}, "tpot_slo_ms must be > 0"),
    ({"tpot_slo_ms": "abc"}, "tpot_slo_ms must be a number"),
    ({"tpot_slo_ms": 1e12}, "tpot_slo_ms must be at most 60000 ms"),
    ({"ttft_slo_ms": -1}, "ttft_slo_ms must be > 0"),
    ({"ttft_slo_ms": "soon"}, "ttft_slo_ms must be a number"),
    ([25], "custom_params"),  # the plugin's message on /generate, pydantic's on OpenAI's
    ({"slo_class": "platinum"}, "slo_class 'platinum' is not a known SLO class"),
    ({"slo_class": "chat", "tpot_slo_ms": 10}, "conflicts with slo_class 'chat'"),
]


def post(
    server, api: str, custom_params, metadata: dict | None = None, stream: bool = False,
    headers: dict | None = None,
) -> requests.Response:
    if api == "generate":
        body = {
            "text": "def f(x):", "stream": stream,
            "sampling_params": {
                "max_new_tokens": 4, "temperature": 0, "custom_params": custom_params,
            },
        }  # fmt: skip
        return requests.post(f"{server.url}/generate", json=body, headers=headers, timeout=120)
    body = {
        "model": "default", "max_tokens": 4, "temperature": 0, "custom_params": custom_params,
        "stream": stream,
    }  # fmt: skip
    if metadata is not None:
        body["metadata"] = metadata
    if api == "completions":
        body["prompt"] = "def f(x):"
    else:
        body["messages"] = [{"role": "user", "content": "hi"}]
    return requests.post(f"{server.url}/v1/{api}", json=body, headers=headers, timeout=120)


APIS = ["generate", "completions", "chat/completions"]


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("params", [{"tpot_slo_ms": 25}, {"slo_class": "chat"}, {}])
def test_valid_slo_is_served(eagle_server, api, params):
    assert post(eagle_server, api, params).status_code == 200


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize(("params", "message"), BAD)
def test_bad_slo_is_rejected_with_400_naming_the_field(eagle_server, api, params, message):
    response = post(eagle_server, api, params)
    assert response.status_code == 400, response.text
    assert message in response.text
    # The server keeps serving.
    assert post(eagle_server, api, {"tpot_slo_ms": 40}).status_code == 200


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize(("params", "message"), BAD[:2] + BAD[-1:])
def test_bad_slo_on_a_stream_is_rejected_naming_the_field(eagle_server, api, params, message):
    response = post(eagle_server, api, params, stream=True)
    # Refused before the stream starts, or as the stream's one error event.
    assert response.status_code == 400 or '"error"' in response.text, response.text
    assert message in response.text
    assert post(eagle_server, api, {"tpot_slo_ms": 40}, stream=True).status_code == 200


def finished_in_class(server, slo_class: str) -> int:
    state = requests.get(f"{server.url}/server_info", timeout=60).json()["internal_states"][0]
    return state["adaspec"]["stats"]["classes"].get(slo_class, {}).get("finished", 0)


@pytest.mark.parametrize("api", ["completions", "chat/completions"])
def test_slo_in_openai_metadata(eagle_server, api):
    """OpenAI's `metadata` object (string values) carries the SLO when `custom_params` is
    absent: the request is served in its class, and a bad value gets 400 naming the field."""
    before = finished_in_class(eagle_server, "chat")
    response = post(eagle_server, api, None, metadata={"slo_class": "chat", "user": "7"})
    assert response.status_code == 200, response.text
    assert finished_in_class(eagle_server, "chat") == before + 1
    response = post(eagle_server, api, None, metadata={"tpot_slo_ms": "fast"})
    assert response.status_code == 400 and "tpot_slo_ms must be a number" in response.text
    assert post(eagle_server, api, None, metadata={"tpot_slo_ms": "40"}).status_code == 200


def test_malformed_slo_config_fails_startup_with_file_and_line(tmp_path):
    config = tmp_path / "slo.yaml"
    config.write_text("classes:\n  chat:\n    tpot_ms: 0\n")
    result = subprocess.run(
        [
            sys.executable, "-m", "sglang.launch_server", "--model-path", "/nonexistent",
            "--slo-config", str(config),
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    assert f"sgl_adaspec: error: {config}:3: class 'chat' tpot_ms must be > 0" in result.stderr


@pytest.mark.parametrize("api", ["generate", "completions"])
@pytest.mark.parametrize("token", [10**9, -1])
def test_a_token_id_outside_the_vocabulary_gets_400_and_the_server_keeps_serving(
    eagle_server, api, token
):
    """SGLang 0.5.23 sends such an id to the embedding, which takes the scheduler down."""
    if api == "generate":
        body = {"input_ids": [5, token], "sampling_params": {"max_new_tokens": 4}}
    else:
        body = {"model": "default", "prompt": [5, token], "max_tokens": 4}
    path = "generate" if api == "generate" else f"v1/{api}"
    response = requests.post(f"{eagle_server.url}/{path}", json=body, timeout=120)
    assert response.status_code == 400, response.text
    assert f"input_ids contains {token}, not a token id" in response.text
    assert post(eagle_server, api, {"tpot_slo_ms": 40}).status_code == 200


@pytest.mark.parametrize("text", ["", ["def f(x):", ""]])
def test_a_prompt_of_no_tokens_gets_400_and_the_server_keeps_serving(eagle_server, text):
    """The tiny tokenizer adds no BOS token, so an empty text is a prompt of no tokens, which
    SGLang 0.5.23 alone prefills and crashes on (its OpenAI endpoints refuse an empty prompt)."""
    response = requests.post(
        f"{eagle_server.url}/generate",
        json={"text": text, "sampling_params": {"max_new_tokens": 4}},
        timeout=120,
    )
    assert response.status_code == 400, response.text
    assert "the prompt is empty" in response.text
    assert post(eagle_server, "generate", {"tpot_slo_ms": 40}).status_code == 200


def post_with_headers(server, api: str, headers: dict, custom_params=None) -> requests.Response:
    """A request whose SLO rides in headers (what a header-forwarding gateway passes on)."""
    return post(server, api, custom_params, headers=headers)


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize(
    ("headers", "slo_class"),
    [({"x-slo-class": "coding"}, "coding"), ({"x-slo-tpot-ms": "45"}, "custom"),
     ({"x-request-id-slo-class": "chat"}, "chat")],  # the name sglang-router forwards
)  # fmt: skip
def test_slo_headers_are_read_on_every_api(eagle_server, api, headers, slo_class):
    before = finished_in_class(eagle_server, slo_class)
    assert post_with_headers(eagle_server, api, headers).status_code == 200
    assert finished_in_class(eagle_server, slo_class) == before + 1


@pytest.mark.parametrize("api", APIS)
def test_the_bodys_slo_wins_over_the_headers(eagle_server, api):
    before = finished_in_class(eagle_server, "chat")
    response = post_with_headers(eagle_server, api, {"x-slo-class": "coding"}, {"slo_class": "chat"})
    assert response.status_code == 200
    assert finished_in_class(eagle_server, "chat") == before + 1


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize(
    ("headers", "named"),
    [({"x-slo-tpot-ms": "fast"}, "x-slo-tpot-ms"), ({"x-slo-class": "platinum"}, "x-slo-class"),
     ({"x-slo-tpot-ms": "-3"}, "x-slo-tpot-ms")],
)  # fmt: skip
def test_a_bad_slo_header_is_a_400_naming_it(eagle_server, api, headers, named):
    response = post_with_headers(eagle_server, api, headers)
    assert response.status_code == 400 and named in response.text, response.text
    assert post_with_headers(eagle_server, api, {}).status_code == 200
