"""Fixtures for the TUI tests: the repo and this folder importable, a fake server."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
if importlib.util.find_spec("localradix") is None:
    sys.path.insert(0, str(HERE.parents[1]))

from tui_fake_server import FakeStatsServer  # noqa: E402


@pytest.fixture
def fake_server():
    server = FakeStatsServer().start()
    yield server
    server.stop()
