"""Fixtures for the bench tests: a fake OpenAI-compatible server over real HTTP."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from fake_openai_server import ServerThread  # noqa: E402


@pytest.fixture(scope="module")
def fake_server():
    with ServerThread() as server:
        yield server


@pytest.fixture
def fresh_server():
    """A server with no requests recorded yet (for counting in-flight requests, bodies)."""
    with ServerThread() as server:
        yield server
