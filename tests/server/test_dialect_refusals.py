"""Refusals made before routing (wrong key 401, foreign origin 403, non-JSON body 415, foreign
host 421) answer in the shape of the dialect the path belongs to: Ollama's `{"error": "..."}` on
/api/*, Anthropic's `{"type": "error", "error": {"type", "message"}}` on /v1/messages, OpenAI's
elsewhere. In process (the middleware answers before any route: no engine is needed)."""

from __future__ import annotations

import pytest
from litestar.testing import TestClient

from localradix.config import ServerArgs
from localradix.server.app import create_app

KEY = "k-7f3a"


@pytest.fixture(scope="module")
def client():
    args = ServerArgs(api_key=KEY)
    with_base = TestClient(create_app(args), base_url=f"http://127.0.0.1:{args.port}")
    return with_base  # outside `with`: no startup, so no engine is started


def refusals(client: TestClient, path: str) -> dict[int, dict]:
    key = {"Authorization": f"Bearer {KEY}"}
    answers = {
        401: client.post(path, json={}),
        403: client.post(path, json={}, headers={**key, "Origin": "http://evil.example"}),
        415: client.post(path, content=b"x", headers={**key, "Content-Type": "text/plain"}),
        421: client.post(path, json={}, headers={**key, "Host": "evil.example"}),
    }
    for status, r in answers.items():
        assert r.status_code == status, (path, r.text)
    return {status: r.json() for status, r in answers.items()}


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate", "/api/show"])
def test_ollama_paths_refuse_in_ollamas_shape(client, path):
    for body in refusals(client, path).values():
        assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"]


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_anthropic_paths_refuse_in_anthropics_shape(client, path):
    bodies = refusals(client, path)
    for body in bodies.values():
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    assert bodies[401]["error"]["type"] == "authentication_error"
    assert bodies[403]["error"]["type"] == "permission_error"


@pytest.mark.parametrize(
    "path", ["/v1/chat/completions", "/v1/responses", "/infill", "/flush_cache"]
)
def test_other_paths_refuse_in_openais_shape(client, path):
    bodies = refusals(client, path)
    assert bodies[401]["error"]["code"] == "invalid_api_key"
    for body in bodies.values():
        assert {"message", "type", "code"} <= set(body["error"])
