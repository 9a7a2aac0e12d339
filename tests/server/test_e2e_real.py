"""End to end: `localradix serve` on the bundled SmolLM2-135M-Instruct, driven by the real
`openai` SDK (one server per module, small KV pool), plus a schemathesis run against the
server's own OpenAPI schema, and the engine process dying under it."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from server_harness import start_server, wait_until

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def stats(server) -> dict:
    return httpx.get(server.base + "/stats", timeout=10).json()


def engine_idle(server) -> bool:
    s = stats(server)
    engine = s["engine"] or {}
    return (
        s["server"]["in_flight"] == 0 and engine.get("running") == 0 and engine.get("kv_used") == 0
    )


def test_chat_greedy(client, model):
    r = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=30, temperature=0)
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens > 10 and 0 < r.usage.completion_tokens <= 30


def test_chat_stream_matches_non_stream_and_reports_usage(client, model):
    kw = dict(model=model, messages=QUESTION, max_tokens=30, temperature=0)
    full = client.chat.completions.create(**kw).choices[0].message.content
    chunks = list(
        client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw)
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    # the same prompt again: its prefix comes from the radix cache
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0


def test_cached_tokens_on_a_repeated_prompt(client, model):
    messages = [{"role": "user", "content": "Tell me about radix trees. " * 20}]
    first = client.chat.completions.create(model=model, messages=messages, max_tokens=2)
    second = client.chat.completions.create(model=model, messages=messages, max_tokens=2)
    assert first.usage.prompt_tokens == second.usage.prompt_tokens
    assert second.usage.prompt_tokens_details.cached_tokens >= second.usage.prompt_tokens - 1
    assert first.usage.prompt_tokens_details.cached_tokens < second.usage.prompt_tokens - 1


@pytest.mark.parametrize("stream", [False, True])
def test_completions(client, model, stream):
    kw = dict(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
    if stream:
        text = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw))
    else:
        text = client.completions.create(**kw).choices[0].text
    assert "Paris" in text


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string(client, model, stream):
    kw = dict(model=model, messages=QUESTION, max_tokens=30, temperature=0, stop=["France"])
    if stream:
        chunks = client.chat.completions.create(stream=True, **kw)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        r = client.chat.completions.create(**kw)
        text = r.choices[0].message.content
        assert r.choices[0].finish_reason == "stop"
    assert "France" not in text and "Paris" not in text
    assert text.startswith("The capital of")


def test_n_and_seed_reproducibility(client, model):
    kw = dict(model=model, messages=QUESTION, max_tokens=6, temperature=1.0, seed=1234, n=3)
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1, 2]
    texts = [c.message.content for c in a.choices]
    assert texts == [c.message.content for c in b.choices]
    assert all(texts)


def test_logprobs(client, model):
    r = client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    content = r.choices[0].logprobs.content
    assert 0 < len(content) <= 6
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[-1].logprob
    # greedy: the chosen token is the most likely one
    assert content[0].token == content[0].top_logprobs[0].token
    r = client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=4, temperature=0, logprobs=2
    )
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4


def test_disconnect_aborts_and_frees_kv(server, model):
    body = {
        "model": model,
        "prompt": "Count to one thousand: 1, 2, 3,",
        "max_tokens": 3000,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", server.base + "/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(3):
            next(lines)
        assert stats(server)["server"]["in_flight"] == 1
    assert wait_until(lambda: engine_idle(server), timeout=15), stats(server)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base + "/completions", json={**body, "stream": False}, timeout=1.5)
    assert wait_until(lambda: engine_idle(server), timeout=15), stats(server)


BAD = [
    (b"{not json", 400),
    (b'{"prompt": 5}', 400),
    (b'{"model": "nope", "prompt": "x"}', 404),
    (b'{"prompt": "x", "temperature": 7e9}', 400),
    (b'{"prompt": "x", "n": 1000}', 400),
    (b'{"prompt": "x", "max_tokens": -1}', 400),
    (b'{"prompt": [1, 2, 999999]}', 400),
    (
        b'{"prompt": "x", "stop": ["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]}',
        400,
    ),
]


@pytest.mark.parametrize("body,status", BAD)
def test_bad_input_is_a_clear_4xx_and_the_server_stays_healthy(server, body, status):
    r = httpx.post(
        server.base + "/completions",
        content=body,
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert r.status_code == status, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert httpx.get(server.url + "/health").status_code == 200


def test_prompt_longer_than_the_context(client, model):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=model, prompt="hello " * 9000, max_tokens=1)
    message = info.value.body["message"]
    assert "8192" in message and "9000" in message or "9001" in message


def test_metrics_after_traffic(server, client, model):
    client.chat.completions.create(model=model, messages=QUESTION, max_tokens=2)
    text = httpx.get(server.url + "/metrics").text
    assert "localradix_time_to_first_token_seconds_count" in text
    count = [
        ln
        for ln in text.splitlines()
        if ln.startswith("localradix_e2e_request_latency_seconds_count")
    ]
    assert int(float(count[0].split()[-1])) > 0


def _within_budget(body: object) -> None:
    """Bound the generation a case asks for (a CPU decodes a few dozen tokens a second) and
    drop the random model name so that valid bodies reach the engine."""
    if not isinstance(body, dict):
        return
    body.pop("model", None)
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        if not isinstance(body.get(key), int) or body[key] > 8:
            body[key] = 8
    if isinstance(body.get("options"), dict):  # Ollama's
        body["options"]["num_predict"] = 8
    if isinstance(body.get("n"), int) and body["n"] > 2:
        body["n"] = 2


@pytest.mark.parametrize("mode_name", ["positive", "negative"])
def test_schemathesis_finds_no_server_errors(server, mode_name):
    """Cases generated from the server's own OpenAPI schema never get a 5xx. Generation is
    bounded here; test_fake_server.py runs the full schemathesis CLI against a fake engine."""
    schemathesis = pytest.importorskip("schemathesis")
    import requests

    mode = schemathesis.GenerationMode(mode_name)
    url = server.url + "/schema/openapi.json"
    # Not the endless stats stream, nor pulls and deletes (the hub; the user's model store):
    # the reasons are in schemathesis.toml, which the fake-server CLI run reads.
    schema = (
        schemathesis.openapi.from_url(url)
        .exclude(path="/v1/stats/stream")
        .exclude(path_regex="^/api/(pull|delete)$")
    )
    statuses: list[int] = []

    @given(case=schema.as_strategy(generation_mode=mode))
    @settings(
        max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None
    )
    def check(case):
        if mode_name == "positive":
            _within_budget(case.body)
        try:
            response = case.call(timeout=30)
        except requests.exceptions.Timeout:
            return  # the client gives up; the server aborts the request (checked below)
        statuses.append(response.status_code)
        assert response.status_code < 500, response.text

    check()
    assert 200 in statuses or mode_name == "negative"


def test_healthy_and_idle_after_the_fuzzing(server):
    assert httpx.get(server.url + "/health").status_code == 200
    assert wait_until(lambda: engine_idle(server), timeout=60), stats(server)


def test_engine_death_gives_503_then_a_restart_and_serves_again():
    """Killing the engine twice: two restarts, a served request after each (cold cache)."""
    server = start_server(["--max-total-tokens", "4096"], fake=False)
    body = {"prompt": "hi", "max_tokens": 2}
    try:
        for restart in (1, 2):
            os.kill(stats(server)["engine_pid"], signal.SIGKILL)
            time.sleep(0.3)
            r = httpx.post(server.base + "/completions", json=body)
            assert r.status_code == 503 and "engine process exited" in r.json()["error"]["message"]
            served = lambda: httpx.post(server.base + "/completions", json=body).status_code == 200  # noqa: E731
            assert wait_until(served, timeout=120), server.log()[-3000:]
            assert httpx.get(server.url + "/health").json()["engine_restarts"] == restart
    finally:
        assert server.stop() == 0, server.log()[-3000:]


def test_engine_death_gives_503_and_a_nonzero_exit():
    server = start_server(["--max-total-tokens", "4096", "--engine-restarts", "0"], fake=False)
    try:
        pid = stats(server)["engine_pid"]
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        r = httpx.post(server.base + "/completions", json={"prompt": "hi", "max_tokens": 2})
        assert r.status_code == 503
        assert "engine process exited" in r.json()["error"]["message"]
        assert httpx.get(server.url + "/health").status_code == 503
        assert server.proc.wait(20) == 1
    finally:
        server.stop(signal.SIGKILL)


def test_a_maximal_body_is_refused_from_its_length_and_health_keeps_answering(server, model):
    """A prompt near the body limit that cannot fit the context in any tokenization is refused
    before it is tokenized (seconds of tokenizer time otherwise), and /health never waits."""
    text = ("the quick brown fox jumps over the lazy dog " * 180_000)[:7_900_000]
    latencies: list[float] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            start = time.monotonic()
            httpx.get(server.url + "/health", timeout=30)
            latencies.append(time.monotonic() - start)
            time.sleep(0.02)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        for route, body in (
            ("/chat/completions", {"messages": [{"role": "user", "content": text}]}),
            ("/completions", {"prompt": text}),
        ):
            r = httpx.post(server.base + route, json={"model": model, **body}, timeout=120)
            error = r.json()["error"]
            assert r.status_code == 400 and error["code"] == "context_length_exceeded", r.text
            assert "at least" in error["message"]
            assert error["param"] == ("messages" if "chat" in route else "prompt")
    finally:
        done.set()
        poller.join()
    assert latencies and max(latencies) < 1.0, max(latencies)
    # A long prompt that may fit is tokenized and measured exactly, as before.
    r = httpx.post(server.base + "/completions", json={"model": model, "prompt": text[:60_000]})
    assert r.status_code == 400 and "at least" not in r.json()["error"]["message"], r.text
