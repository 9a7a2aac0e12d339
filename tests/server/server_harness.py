"""Start `localradix serve` as a user would (a subprocess) and wait until it is healthy."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
FAKE_ENV = {
    "LOCALRADIX_ENGINE_CORE": "fake_engine_core:FakeCore",
    "LOCALRADIX_TOKENIZER": "fake_engine_core:fake_tokenizer",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    proc: subprocess.Popen
    url: str
    log_path: Path

    @property
    def base(self) -> str:
        return self.url + "/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGINT, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_server(
    args: list[str], *, fake: bool, env: dict[str, str] | None = None, timeout: float = 240
) -> Server:
    port = free_port()
    full_env = {**os.environ, **(env or {})}
    paths = [str(REPO)] + ([str(HERE)] if fake else [])
    full_env["PYTHONPATH"] = os.pathsep.join(paths + [full_env.get("PYTHONPATH", "")])
    if fake:
        full_env.update(FAKE_ENV)
    log_path = Path(tempfile.mkstemp(prefix="localradix-serve-", suffix=".log")[1])
    cmd = [sys.executable, "-m", "localradix", "serve", *args, "--port", str(port)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=REPO)
    server = Server(proc, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{server.log()}")
        try:
            if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    server.stop(signal.SIGKILL)
    raise RuntimeError(f"server not healthy after {timeout}s:\n{server.log()}")


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


# ---- fixtures: one real server per module (imported by conftest.py and the MLX suite) ------
@pytest.fixture(scope="module")
def server():
    """One real server per module on the bundled model and the torch CPU runner, with a small
    KV pool (a module may override `server`, e.g. with `--backend mlx`; test_fake_server
    overrides `client`)."""
    args = ["--backend", "cpu", "--max-total-tokens", "16384", "--max-running-requests", "16"]
    s = start_server(args, fake=False)
    yield s
    assert s.stop() == 0, s.log()[-3000:]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base, api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id
