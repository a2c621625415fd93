"""The test launcher survives a port taken between choosing it and the server binding it
(CI saw gloo's connections under --tp 2 take a port drawn from the ephemeral range)."""

from __future__ import annotations

import socket

import pytest
import requests

from sgl_adaspec.local_server.launch import PORT_RANGE, Server, free_port


def test_free_ports_lie_below_the_ephemeral_range():
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low = int(f.read().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(PORT_RANGE[0] <= p <= PORT_RANGE[1] < ephemeral_low for p in ports)
    assert len(ports) > 1


@pytest.mark.slow
def test_a_server_whose_port_is_taken_moves_to_another(models, tmp_path):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        with Server(models.target, port=taken, log_path=tmp_path / "server.log") as server:
            assert server.port != taken
            assert requests.get(f"{server.url}/health", timeout=5).status_code == 200
            assert len(server.generate("hello", max_new_tokens=4)["output_ids"]) == 4
