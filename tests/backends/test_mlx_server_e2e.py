"""`localradix serve --backend mlx` passes the server's end-to-end suite.

The tests of tests/server/test_e2e_real.py are imported here and run against a server started
with `--backend mlx` (this module's `server` fixture overrides theirs). The engine-death test is
left out: it starts its own (default-backend) server and tests the server, not the backend.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from .conftest import HAS_MLX

SERVER_TESTS = str(Path(__file__).resolve().parent.parent / "server")
if SERVER_TESTS not in sys.path:
    sys.path.insert(0, SERVER_TESTS)

if HAS_MLX:
    from server_harness import client, model, start_server  # noqa: F401 (fixtures)
    from test_e2e_real import *  # noqa: F403  (the suite: tests and their fixtures)

    del test_engine_death_gives_503_and_a_nonzero_exit  # noqa: F821
    del test_engine_death_gives_503_then_a_restart_and_serves_again  # noqa: F821

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not HAS_MLX, reason="mlx is not installed (pip install mlx[cpu])"),
]


@pytest.fixture(scope="module")
def server():
    s = start_server(
        ["--backend", "mlx", "--max-total-tokens", "16384", "--max-running-requests", "16"],
        fake=False,
    )
    yield s
    assert s.stop() == 0, s.log()[-3000:]


def test_the_server_runs_on_mlx(server):
    assert "Backend mlx" in server.log()
