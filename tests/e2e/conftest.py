"""Servers shared by the end-to-end modules (each start costs ~30 s on 2 cores)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import requests

from sgl_adaspec.local_server.launch import Server, eagle_flags


def start(tmp_path_factory, name: str, model: Path, *extra: str, env=None) -> Server:
    log = tmp_path_factory.mktemp(name) / "server.log"
    return Server(model, extra_args=tuple(extra), env=env or {}, log_path=log).start()


def wait_until(read, done, what: str, deadline_s: float = 120.0):
    """`read()` polled until `done(value)`; that value. Tests wait on what the server reports,
    never on a sleep of a guessed length."""
    end = time.monotonic() + deadline_s
    while True:
        value = read()
        if done(value):
            return value
        if time.monotonic() > end:
            raise AssertionError(f"{what} not seen in {deadline_s} s; last: {value}")
        time.sleep(0.1)


def scheduler_load(url: str) -> dict:
    """SGLang's own count of running and waiting requests (`/v1/loads`)."""
    return requests.get(f"{url}/v1/loads", params={"include": "core"}, timeout=60).json()[
        "loads"
    ][0]


def metric_values(text: str) -> dict[str, float]:
    """The plugin's series in a /metrics text: name with labels -> value."""
    return {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith("sglang_adaspec:")
    }


@pytest.fixture(scope="session")
def eagle_server(models, tmp_path_factory):
    """tiny-llama with its EAGLE draft (steps 3, topk 2, 6 tokens) and --spec-policy adaserve."""
    server = start(
        tmp_path_factory, "eagle", models.target, *eagle_flags(models.eagle_draft),
        "--spec-policy", "adaserve", "--adaserve-budget-rule", "knee",
    )  # fmt: skip
    yield server
    server.stop()


@pytest.fixture(scope="session")
def plain_server(models, tmp_path_factory):
    """tiny-llama without speculation: the reference of every losslessness test on that target
    (one server for the session; it sleeps while idle)."""
    server = start(tmp_path_factory, "plain", models.target)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def random_pair_reference(plain_server):
    """The mixed batch's greedy outputs on tiny-llama without speculation (`mixed_batch`)."""
    from .mixed_batch import reference_outputs

    return reference_outputs(plain_server)


@pytest.fixture(scope="session")
def bigram_pair_reference(models, tmp_path_factory):
    """The mixed batch's greedy outputs on the bigram target without speculation."""
    from .mixed_batch import reference_outputs

    server = start(tmp_path_factory, "plain-bigram", models.bigram_target)
    try:
        return reference_outputs(server)
    finally:
        server.stop()
