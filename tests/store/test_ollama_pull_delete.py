"""Ollama's /api/pull and /api/delete over the model store, through the unchanged `ollama`
client, against the hub stand-in (the routes huggingface-hub calls: repo info with file
metadata, file HEAD and GET). The server runs the fake engine: pulling and deleting load
nothing, and the real store code runs unchanged."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import pytest
from hub_standin import HubStandIn, Repo
from store_support import FOLDER_REPO, GGUF_REPO, REPO, bundled_gguf, start_serve, store_env

FAKE = {
    "LOCALRADIX_ENGINE_CORE": "fake_engine_core:FakeCore",
    "LOCALRADIX_TOKENIZER": "fake_engine_core:fake_tokenizer",
    "PYTHONPATH": f"{REPO}:{Path(REPO, 'tests', 'server')}",
}


@pytest.fixture(scope="module")
def server(
    hub_repos: dict[str, Repo], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    hub = HubStandIn(hub_repos).start()
    home = tmp_path_factory.mktemp("user")
    env = {**store_env(home, hub), **FAKE}
    proc, url = start_serve(env, None, home / "serve.log")
    yield url, home / "hf"
    proc.terminate()
    proc.wait(30)
    hub.stop()


def test_pull_streams_progress_then_lists_and_deletes_the_model(server) -> None:
    url, hf_home = server
    client = ollama.Client(host=url)
    events = list(client.pull(f"{GGUF_REPO}:q4_1", stream=True))
    statuses = [e.status for e in events]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success", statuses
    progress = [e for e in events if e.total]
    size = bundled_gguf().stat().st_size  # the stand-in serves the bundled file as Q4_1
    assert progress and progress[-1].total == progress[-1].completed == size, progress
    names = [m.model for m in client.list().models]
    assert any(GGUF_REPO.lower() in (n or "").lower() for n in names), names
    assert list(hf_home.rglob("*.gguf")), "the file is in the hub cache"

    client.delete(f"{GGUF_REPO}:Q4_1")
    assert not list(hf_home.rglob("*.gguf"))
    with pytest.raises(ollama.ResponseError) as err:
        client.delete(f"{GGUF_REPO}:Q4_1")
    assert err.value.status_code == 404


def test_pull_without_streaming_and_bad_names(server) -> None:
    url, _ = server
    assert ollama.Client(host=url).pull(FOLDER_REPO).status == "success"
    cases = [
        ("/api/pull", {"model": "llama3"}, 400),  # not a repo id
        ("/api/pull", {}, 400),
        ("/api/pull", {"model": f"{GGUF_REPO}:Q9_9", "stream": False}, 400),  # no such quant
        ("/api/pull", {"model": "test-org/missing", "stream": False}, 400),
        ("/api/create", {"model": "x"}, 501),
    ]
    for path, body, status in cases:
        r = httpx.post(url + path, json=body, timeout=60)
        assert r.status_code == status, (path, body, r.text)
        assert set(r.json()) == {"error"}, r.text
    streamed = httpx.post(url + "/api/pull", json={"model": f"{GGUF_REPO}:Q9_9"}, timeout=60)
    lines = [json.loads(line) for line in streamed.text.splitlines()]
    assert lines[0] == {"status": "pulling manifest"} and "Q9_9" in lines[-1]["error"], lines
    r = httpx.request("DELETE", url + "/api/delete", json={"model": "no-such-model"})
    assert r.status_code == 404 and "not found" in r.json()["error"]
