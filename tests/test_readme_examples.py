"""README.md's examples, run as a reader would: every `curl` block and every Python block, as
printed (only the port changes), against one real `localradix serve` on the bundled model, each
within EXAMPLE_TIMEOUT_S. Install and serve commands are checked by test_readme_commands.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from readme_blocks import README, REPO, fenced_blocks, shell_commands
from server.server_harness import start_server

EXAMPLE_TIMEOUT_S = 90  # a hang guard: each takes seconds on an idle laptop CPU
README_URL = "http://127.0.0.1:8000"

pytestmark = pytest.mark.slow


def examples() -> list[tuple[str, str]]:
    """(kind, code) of every runnable example: bash blocks made of curl calls, Python blocks."""
    found = []
    for lang, code in fenced_blocks(README.read_text()):
        if lang == "python":
            found.append(("python", code))
        elif lang == "bash" and all(c[0] == "curl" for c in shell_commands(code)):
            found.append(("curl", code))
    return found


EXAMPLES = examples()


@pytest.fixture(scope="module")
def server():
    """`localradix serve` as the quick start runs it (backend auto), with a small KV pool."""
    s = start_server(["--max-total-tokens", "16384"], fake=False)
    yield s
    assert s.stop() == 0, s.log()[-3000:]


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=EXAMPLE_TIMEOUT_S,
    )


def test_the_readme_has_the_examples():
    kinds = [kind for kind, _ in EXAMPLES]
    assert kinds.count("curl") >= 2 and kinds.count("python") >= 3


@pytest.mark.parametrize(
    "kind, code", EXAMPLES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(EXAMPLES)]
)
def test_readme_example_runs_in_time(server, kind, code):
    code = code.replace(README_URL, server.url)
    if kind == "curl":
        if shutil.which("curl") is None:
            pytest.skip("curl is not installed")
        for argv in shell_commands(code):
            r = run([*argv, "--silent", "--show-error", "--max-time", str(EXAMPLE_TIMEOUT_S)])
            assert r.returncode == 0, r.stderr
            reply = json.loads(r.stdout)
            assert "error" not in reply, reply
            if "/tokenize" in argv[1] or "/detokenize" in argv[1]:
                assert reply.get("tokens") or reply.get("content"), reply
                continue
            choice = reply["choices"][0]
            content = choice["message"]["content"]
            assert content and choice["finish_reason"] in ("stop", "length"), reply
            if "json_schema" in code:  # bounded by its schema: ends by itself, and parses
                person = json.loads(content)
                assert choice["finish_reason"] == "stop", reply
                assert isinstance(person["name"], str) and 0 <= person["age"] <= 150
        return
    r = run([sys.executable, "-c", code])
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert lines and not any(line.startswith("None") for line in lines), r.stdout
