"""Fixtures for the bench tests: a fake OpenAI-compatible server over real HTTP."""

from __future__ import annotations

import pytest
from fake_openai_server import ServerThread


@pytest.fixture(scope="module")
def fake_server():
    with ServerThread() as server:
        yield server


@pytest.fixture
def fresh_server():
    """A server with no requests recorded yet (for counting in-flight requests, bodies)."""
    with ServerThread() as server:
        yield server
