"""Fixtures for the server tests; the helpers live in server_harness.py."""

from __future__ import annotations

import pytest
from server_harness import client, model, server, start_server  # noqa: F401 (fixtures)


@pytest.fixture(scope="module")
def fake_server():
    """One FAKE-engine server per module (no model: fast and deterministic). Requests that omit
    max_tokens (the fuzzer's) get 16 tokens, as OpenAI's legacy completions default."""
    args = ["--max-running-requests", "8", "--max-queued-requests", "32"]
    fake = start_server([*args, "--default-max-tokens", "16"], fake=True)
    yield fake
    fake.stop()
