"""`localradix serve --backend llamacpp` passes the server's end-to-end suites.

The tests of tests/server/test_e2e_real.py (OpenAI SDK, streaming, tools, aborts, the KV leak
check) and test_structured_e2e.py (JSON schema, regex, forced tool calls) are imported here and
run against a server started with `--backend llamacpp` (this module's `server` fixture
overrides theirs). The engine-death test is left out: it starts its own server and tests the
server, not the backend.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from .conftest import HAS_LLAMA_CPP

SERVER_TESTS = str(Path(__file__).resolve().parent.parent / "server")
if SERVER_TESTS not in sys.path:
    sys.path.insert(0, SERVER_TESTS)

if HAS_LLAMA_CPP:
    from server_harness import client, model, start_server  # noqa: F401 (fixtures)
    from test_e2e_real import *  # noqa: F403  (the suite: tests and their fixtures)
    from test_structured_e2e import *  # noqa: F403

    del test_engine_death_gives_503_and_a_nonzero_exit  # noqa: F821

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not HAS_LLAMA_CPP, reason="llama-cpp-python is not installed (localradix[llamacpp])"
    ),
]


@pytest.fixture(scope="module")
def server():
    s = start_server(
        ["--backend", "llamacpp", "--max-total-tokens", "16384", "--max-running-requests", "16"],
        fake=False,
    )
    yield s
    assert s.stop() == 0, s.log()[-3000:]


def test_the_server_runs_on_llamacpp(server):
    assert "Backend llamacpp" in server.log()
    assert "llama.cpp: llama" in server.log()
