"""Several models behind one server (issue 17), as a user runs them: pull a GGUF repo by quant
tag and a tiny HF folder from the hub stand-in, `serve` (the bundled model by default), and ask
for each by name through the `openai` SDK, Ollama's routes and the Anthropic route. The tests of
a module share its servers and run in order."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
from hub_standin import HubStandIn, Repo
from store_support import FOLDER_REPO, GGUF_REPO, REPO, cli, start_serve, store_env

pytestmark = pytest.mark.slow  # `serve` processes loading and unloading models

DEFAULT = "SmolLM2-135M-Instruct"  # the bundled model, served when `serve` gets none
GGUF = f"{GGUF_REPO}:Q4_1"  # listed by ref: its derived alias is the bundled model's too
TINY = "tiny-llama:1m-f32"
LOGS: dict[str, Path] = {}  # each server's log, by URL
FAKE = {  # test_budget: a fake engine (nothing loads; the budget is checked before)
    "LOCALRADIX_ENGINE_CORE": "fake_engine_core:FakeCore",
    "LOCALRADIX_TOKENIZER": "fake_engine_core:fake_tokenizer",
}


@pytest.fixture(scope="module")
def env(hub_repos: dict[str, Repo], tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A user who pulled the GGUF by quant tag and the folder (the hub is gone afterwards)."""
    hub = HubStandIn(hub_repos).start()
    env = store_env(tmp_path_factory.mktemp("user"), hub)
    for ref in (f"{GGUF_REPO}:q4_1", FOLDER_REPO):
        r = cli(env, "pull", ref)
        assert r.returncode == 0, r.stderr
    hub.stop()
    return {**env, "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def serve(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable]:
    """Start `localradix serve FLAGS` servers (all stopped at the end of the module)."""
    procs: list[subprocess.Popen] = []
    folder = tmp_path_factory.mktemp("logs")

    def start(*flags: str, extra_env: dict[str, str] | None = None) -> str:
        log = folder / f"serve-{len(procs)}.log"
        proc, url = start_serve({**env, **(extra_env or {})}, None, log, *flags)
        procs.append(proc)
        LOGS[url] = log
        return url

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="module")
def url(serve: Callable) -> str:
    return serve("--max-loaded-models", "2")


def health_models(url: str) -> dict[str, str]:
    r = httpx.get(url + "/health", timeout=10)
    assert r.status_code == 200, r.text
    return r.json()["models"]


def wait_for(check: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def chat(client: openai.OpenAI, model: str, **extra) -> str:
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Say hi"}],
        max_tokens=8,
        temperature=0,
        **extra,
    )
    assert reply.model == model
    return reply.choices[0].message.content or ""


def test_models_lists_the_store_and_health_the_default_model(url):
    ids = [m.id for m in openai.OpenAI(base_url=url + "/v1", api_key="x").models.list()]
    assert ids[0] == DEFAULT and {GGUF, TINY} <= set(ids[1:])
    tags = [m["name"] for m in httpx.get(url + "/api/tags").json()["models"]]
    assert tags[0] == DEFAULT and {GGUF, TINY} <= set(tags)
    assert health_models(url) == {DEFAULT: "ready"}


def test_a_second_model_loads_on_first_use(url):
    client = openai.OpenAI(base_url=url + "/v1", api_key="x")
    pulled = chat(client, GGUF)
    assert pulled and pulled == chat(client, DEFAULT)  # the same weights: the same greedy text
    assert health_models(url) == {DEFAULT: "ready", GGUF: "ready"}


def test_ps_shows_the_loaded_models_with_memory_and_expiry(url, env):
    running = {m["name"]: m for m in httpx.get(url + "/api/ps").json()["models"]}
    assert set(running) == {DEFAULT, GGUF}
    assert running[GGUF]["size"] > 50_000_000 and running[GGUF]["expires_at"]
    r = cli(env, "ps", "--url", url)
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines()}
    assert rows["NAME"][4:] == ["MEMORY", "STATE", "UNTIL"]
    assert rows[DEFAULT][-1] == "forever" and rows[GGUF][-2] == "ready"
    assert rows[GGUF][-1].startswith(("4m", "5m"))  # --keep-alive's default: 5 minutes


def test_a_third_model_unloads_the_least_recently_used_idle_one(url):
    from concurrent.futures import ThreadPoolExecutor

    client = openai.OpenAI(base_url=url + "/v1", api_key="x")

    def complete(prompt: str):  # random weights: ignore_eos makes it generate all 4 tokens
        return client.completions.create(
            model=TINY, prompt=prompt, max_tokens=4, temperature=0, extra_body={"ignore_eos": True}
        )

    with ThreadPoolExecutor(2) as threads:  # both wait on one load
        replies = list(threads.map(complete, ["a b c", "d e f"]))
    assert all(r.model == TINY and r.usage.completion_tokens == 4 for r in replies)
    assert LOGS[url].read_text().count(f"loaded '{TINY}'") == 1
    assert health_models(url) == {DEFAULT: "ready", TINY: "ready"}


def test_keep_alive_0_unloads_the_model_after_the_request(url):
    # Ollama's idiom: no prompt, keep_alive 0 unloads a loaded model.
    r = httpx.post(url + "/api/generate", json={"model": TINY, "keep_alive": 0}, timeout=60)
    assert r.status_code == 200 and r.json()["done_reason"] == "unload"
    wait_for(lambda: TINY not in health_models(url), 10)
    # The same field on an OpenAI body (an extension): loaded, answered, unloaded.
    client = openai.OpenAI(base_url=url + "/v1", api_key="x")
    assert chat(client, GGUF, extra_body={"keep_alive": 0})
    wait_for(lambda: health_models(url) == {DEFAULT: "ready"}, 10)


def test_a_pinned_model_stays_and_what_cannot_fit_is_a_503(serve):
    url = serve("--max-loaded-models", "2", "--pin", TINY, "--keep-alive", "0")
    wait_for(lambda: health_models(url).get(TINY) == "ready")
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.APIStatusError) as caught:
        chat(client, GGUF)
    err = caught.value
    assert err.status_code == 503 and err.response.headers["retry-after"]
    message = err.response.json()["error"]["message"]
    assert f"cannot load the model '{GGUF}'" in message and f"{TINY} (pinned)" in message
    assert "--max-loaded-models" in message and "memory budget" in message
    r = httpx.post(url + "/api/chat", json={"model": GGUF, "messages": [{"role": "user"}]})
    assert r.status_code == 503 and "cannot load the model" in r.json()["error"]
    # keep_alive 0 does not unload a pinned model.
    reply = client.completions.create(
        model=TINY, prompt="a b", max_tokens=2, extra_body={"keep_alive": 0, "ignore_eos": True}
    )
    assert reply.usage.completion_tokens == 2
    time.sleep(1)
    assert health_models(url) == {DEFAULT: "ready", TINY: "ready"}


def test_a_model_over_the_memory_budget_is_a_503_naming_the_budget(serve):
    fake = {**FAKE, "PYTHONPATH": f"{REPO}:{Path(REPO, 'tests', 'server')}"}
    url = serve("--memory-budget", "10MiB", extra_env=fake)
    body = {"model": GGUF, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 503, r.text
    error = r.json()["error"]
    assert error["code"] == "model_too_large"
    assert f"the model '{GGUF}' needs about" in error["message"]
    assert "the memory budget is 10 MiB" in error["message"]
    assert "--memory-budget" in error["message"]
    r = httpx.post(url + "/v1/messages", json=body, timeout=60)  # Anthropic's shape
    assert r.status_code == 503 and r.json()["type"] == "error"
    assert "memory budget" in r.json()["error"]["message"]
    assert health_models(url) == {"fake-model": "ready"}
