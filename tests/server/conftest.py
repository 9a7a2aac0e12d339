"""Fixtures for the server tests; the helpers live in server_harness.py."""

from __future__ import annotations

import pytest
from server_harness import client, model, server, start_server  # noqa: F401 (fixtures)


@pytest.fixture(scope="module")
def fake_server():
    """One FAKE-engine server per module (no model: fast and deterministic)."""
    fake = start_server(["--max-running-requests", "8", "--max-queued-requests", "32"], fake=True)
    yield fake
    fake.stop()
