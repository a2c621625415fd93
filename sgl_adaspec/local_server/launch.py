"""Start and stop a real SGLang server on CPU for tests, benchmarks and the demo.

The flags are the CPU recipe that works on SGLang 0.5.23 with this plugin: torch_native
attention, pytorch sampling, no CUDA graphs, a bounded KV pool, float32.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import requests

CPU_FLAGS = (
    "--device", "cpu",
    "--attention-backend", "torch_native",
    "--sampling-backend", "pytorch",
    "--cuda-graph-backend-decode", "disabled",
    "--cuda-graph-backend-prefill", "disabled",
    "--dtype", "float32",
    "--max-total-tokens", "8192",
    "--max-running-requests", "8",
    # SGLang's scheduler busy-polls when idle otherwise: one of two cores lost per server.
    "--sleep-on-idle",
)  # fmt: skip


def eagle_flags(draft: Path, steps: int = 3, topk: int = 2, num_draft_tokens: int = 6):
    return (
        "--speculative-algorithm", "EAGLE",
        "--speculative-draft-model-path", str(draft),
        "--speculative-num-steps", str(steps),
        "--speculative-eagle-topk", str(topk),
        "--speculative-num-draft-tokens", str(num_draft_tokens),
    )  # fmt: skip


def standalone_flags(draft: Path, steps: int = 3, topk: int = 2, num_draft_tokens: int = 6):
    flags = list(eagle_flags(draft, steps, topk, num_draft_tokens))
    flags[1] = "STANDALONE"
    return tuple(flags)


# Below the kernel's ephemeral range (32768+ by default), where outgoing connections (gloo's
# under --tp, the test client's) take their local ports, and below 22000, where SGLang draws
# its own NCCL port: a port chosen here stays free until the server binds it.
PORT_RANGE = (12000, 21999)
BIND_ERROR = "error while attempting to bind on address"
START_ATTEMPTS = 3


def free_port(low: int = PORT_RANGE[0], high: int = PORT_RANGE[1]) -> int:
    for port in random.sample(range(low, high + 1), 64):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {low}..{high}")


@dataclass
class Server:
    """A `python -m sglang.launch_server` child process on 127.0.0.1."""

    model: Path
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    base_flags: tuple[str, ...] = CPU_FLAGS
    log_path: Path | None = None
    startup_timeout_s: float = 300.0
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "sglang.launch_server",
            "--model-path", str(self.model),
            "--host", "127.0.0.1", "--port", str(self.port),
            *self.base_flags, *self.extra_args,
        ]  # fmt: skip

    def start(self) -> Self:
        """Start and wait until healthy; a port taken meanwhile by another process is replaced."""
        if self.log_path is None:  # the log is how a lost port is seen
            self.log_path = Path(tempfile.mkdtemp(prefix="sglang-server-")) / "server.log"
        for _ in range(START_ATTEMPTS):
            if self._start_once():
                return self
            self.port = free_port()
        raise RuntimeError(f"server could not bind a port in {START_ATTEMPTS} attempts")

    def _start_once(self) -> bool:
        """True once healthy; False if the HTTP port was taken (the server is then stopped)."""
        with open(self.log_path, "w") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
                start_new_session=True,  # so stop() can end the whole process group
            )
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"server exited with {self.process.returncode}{self._log_tail()}"
                )
            try:
                if requests.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return True
            except requests.RequestException:
                pass
            if BIND_ERROR in Path(self.log_path).read_text(errors="replace"):
                # uvicorn logs the error but SGLang's process then waits forever.
                self.stop()
                return False
            time.sleep(1.0)
        self.stop()
        raise TimeoutError(f"server not healthy after {self.startup_timeout_s} s{self._log_tail()}")

    def _log_tail(self) -> str:
        if not self.log_path or not Path(self.log_path).exists():
            return ""
        lines = Path(self.log_path).read_text(errors="replace").splitlines()[-40:]
        return "\n--- server log tail ---\n" + "\n".join(lines)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            # SGLang's launcher treats its children's SIGTERM exit as a crash and sleeps 5 s
            # before its diagnostics; nothing is left to save by then.
            self.process.wait(timeout=3)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def generate(self, text: str, max_new_tokens: int = 32, **sampling) -> dict:
        params = {"temperature": 0.0, "max_new_tokens": max_new_tokens, **sampling}
        response = requests.post(
            f"{self.url}/generate",
            json={"text": text, "sampling_params": params, "return_logprob": False},
            timeout=300,
        )
        response.raise_for_status()
        return response.json()
