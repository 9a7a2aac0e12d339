"""`localradix run` (a terminal chat on the in-process engine) and `localradix ps` (a running
server's models), as a user runs them."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from localradix.chat_repl import read_message

REPO = Path(__file__).resolve().parents[2]


def reader(lines: list[str]):
    feed = iter(lines)

    def read(prompt: str) -> str:
        try:
            return next(feed)
        except StopIteration:
            raise EOFError from None

    return read


@pytest.mark.parametrize(
    "lines, message",
    [
        (["hello"], "hello"),
        (['"""', "line one", "line two", '"""'], "line one\nline two"),
        (['"""first', 'last"""'], "first\nlast"),
        (['"""one line"""'], "one line"),
        (["/bye"], None),
        ([], None),
        (['"""', "cut by ctrl-d"], None),
    ],
)
def test_read_message(lines, message):
    assert read_message(reader(lines)) == message


def localradix(*args: str, stdin: str = "", env: dict[str, str] | None = None):
    return subprocess.run(
        [sys.executable, "-m", "localradix", *args],
        input=stdin, capture_output=True, text=True, cwd=REPO, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )  # fmt: skip


@pytest.mark.slow
def test_run_streams_replies_and_shows_the_cache_hit():
    script = 'Hi there\n"""\nTell me\na short joke\n"""\n/bye\n'
    r = localradix("run", "--temperature", "0", "--max-new-tokens", "8", stdin=script)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("SmolLM2-135M-Instruct (/bye quits")
    hits = [tuple(map(int, m)) for m in re.findall(r"\[cache hit: (\d+) of (\d+) prompt", r.stdout)]
    assert len(hits) == 2, r.stdout
    (first_cached, first_prompt), (second_cached, second_prompt) = hits
    assert first_cached == 0 and second_cached >= first_prompt  # turn 1 is turn 2's prefix
    assert second_prompt > second_cached


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fake_server(tmp_path: Path) -> Iterator[str]:
    """`localradix serve` on the fake engine core of tests/server (no model loaded)."""
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests" / "server")]),
        "LOCALRADIX_ENGINE_CORE": "fake_engine_core:FakeCore",
        "LOCALRADIX_TOKENIZER": "fake_engine_core:fake_tokenizer",
    }
    log = open(tmp_path / "serve.log", "wb")
    cmd = [sys.executable, "-m", "localradix", "serve", "--port", str(port),
           "--served-model-name", "coder:7b"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def test_ps_lists_a_running_servers_model(fake_server):
    r = localradix("ps", "--url", fake_server)
    assert r.returncode == 0, r.stderr
    header, row = r.stdout.splitlines()
    assert header.split()[:4] == ["NAME", "BACKEND", "DEVICE", "CONTEXT"]
    assert row.split()[0] == "coder:7b"


def test_ps_without_a_server_says_how_to_start_one():
    r = localradix("ps", "--url", f"http://127.0.0.1:{free_port()}")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1].startswith("localradix: error: no server answers")
    assert "`localradix serve`" in r.stderr
