"""The official `openai` client against the plugin's server: SLOs go in `extra_body`
(`custom_params`) on chat (streaming and not) and completions; a bad value raises
`openai.BadRequestError` naming the field, and the server keeps serving."""

from __future__ import annotations

import openai
import pytest

SLOS = [{"tpot_slo_ms": 30}, {"slo_class": "chat"}]


@pytest.fixture(scope="module")
def client(eagle_server):
    return openai.OpenAI(base_url=f"{eagle_server.url}/v1", api_key="none", max_retries=0)


def finished(eagle_server, custom_params: dict) -> int:
    """Requests the server finished under the class these SLO fields name (a numeric SLO's
    class is "custom")."""
    import requests

    info = requests.get(f"{eagle_server.url}/server_info", timeout=60).json()
    classes = info["internal_states"][0]["adaspec"]["stats"]["classes"]
    return classes.get(custom_params.get("slo_class", "custom"), {}).get("finished", 0)


def chat(client, custom_params: dict, stream: bool):
    return client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Write a loop."}],
        max_tokens=6, temperature=0, stream=stream,
        extra_body={"custom_params": custom_params, "ignore_eos": True},
    )  # fmt: skip


@pytest.mark.parametrize("custom_params", SLOS)
def test_chat_carries_the_slo(client, eagle_server, custom_params):
    before = finished(eagle_server, custom_params)
    reply = chat(client, custom_params, stream=False)
    assert reply.usage.completion_tokens == 6
    assert finished(eagle_server, custom_params) == before + 1  # counted under its class


@pytest.mark.parametrize("custom_params", SLOS)
def test_streaming_chat_carries_the_slo(client, eagle_server, custom_params):
    before = finished(eagle_server, custom_params)
    chunks = list(chat(client, custom_params, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(chunks) >= 2 and text
    assert finished(eagle_server, custom_params) == before + 1


@pytest.mark.parametrize("custom_params", SLOS)
@pytest.mark.parametrize("stream", [False, True])
def test_completions_carry_the_slo(client, eagle_server, stream, custom_params):
    before = finished(eagle_server, custom_params)
    reply = client.completions.create(
        model="default", prompt="def f(x):", max_tokens=6, temperature=0, stream=stream,
        extra_body={"custom_params": custom_params, "ignore_eos": True},
    )  # fmt: skip
    if stream:
        text = "".join(chunk.choices[0].text for chunk in reply if chunk.choices)
    else:
        text = reply.choices[0].text
    assert text
    assert finished(eagle_server, custom_params) == before + 1


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_bad_slo_raises_bad_request_naming_the_field(client, api):
    bad = {"custom_params": {"tpot_slo_ms": -5}}
    with pytest.raises(openai.BadRequestError, match="tpot_slo_ms must be > 0"):
        if api == "chat":
            chat(client, bad["custom_params"], stream=False)
        else:
            client.completions.create(model="default", prompt="x", max_tokens=2, extra_body=bad)
    # The server keeps serving.
    assert chat(client, {"tpot_slo_ms": 40}, stream=False).usage.completion_tokens == 6
