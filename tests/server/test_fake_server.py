"""The HTTP server against a FAKE engine core (tests/server/fake_engine_core.py): the protocol,
streaming, fan-out, errors and lifecycle, fast and without a model. The same server binary and
process layout as production; only the EngineCore and tokenizer are doubles."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from server_harness import start_server, wait_until

MODEL = "fake-model"
GREEDY = "The quick brown fox 🦊 jumps over the lazy dog. "


def greedy(n_tokens: int) -> str:
    """The fake's greedy output after n byte tokens."""
    return (GREEDY * 4).encode()[:n_tokens].decode()


@pytest.fixture(scope="module")
def client(fake_server):
    return openai.OpenAI(base_url=fake_server.base, api_key="unused", max_retries=0)


def idle(server) -> bool:
    stats = httpx.get(server.base + "/stats").json()
    return stats["server"]["in_flight"] == 0 and stats["engine"]["running"] == 0


# ---- the OpenAI protocol ------------------------------------------------------------------


def test_fake_chat_non_streaming_text_and_usage(client):
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=25, temperature=0
    )
    assert r.choices[0].message.content == greedy(25)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 25
    assert r.usage.prompt_tokens == len("<user>hi\n<assistant>")
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_fake_chat_streaming_assembles_the_same_text(client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=25,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == greedy(25)
    assert not any("\ufffd" in (c.choices[0].delta.content or "") for c in chunks if c.choices)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 25


def test_fake_cached_tokens_on_a_repeated_prompt(client):
    messages = [{"role": "user", "content": "a long shared prefix " * 10}]
    client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert r.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens - 1


@pytest.mark.parametrize("stream", [False, True])
def test_fake_stop_string_is_cut(client, stream):
    kw = dict(model=MODEL, prompt="x", max_tokens=60, temperature=0, stop=["jumps"])
    if stream:
        text = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw))
    else:
        r = client.completions.create(**kw)
        text = r.choices[0].text
        assert r.choices[0].finish_reason == "stop"
    assert text == "The quick brown fox 🦊 "


def test_fake_eos_ends_with_stop_and_no_special_text(client):
    r = client.completions.create(model=MODEL, prompt="[eos]", max_tokens=100, temperature=0)
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == "The quick brown fox 🦊 jumps over the lazy dog."


def test_fake_n_choices_and_seed_reproducibility(client):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "s"}], max_tokens=12, seed=7)
    a = client.chat.completions.create(n=3, **kw)
    b = client.chat.completions.create(n=3, **kw)
    texts = [c.message.content for c in a.choices]
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert texts == [c.message.content for c in b.choices]
    assert len(set(texts)) == 3  # seed + i per choice
    assert a.usage.completion_tokens == 36


def test_fake_streaming_n_choices(client):
    chunks = list(
        client.completions.create(model=MODEL, prompt="p", max_tokens=5, n=2, seed=1, stream=True)
    )
    texts = {0: "", 1: ""}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.text
    assert all(len(t) == 5 for t in texts.values())


def test_fake_chat_logprobs(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = r.choices[0].logprobs.content
    assert [c.token for c in content] == ["T", "h", "e"]
    assert all(len(c.top_logprobs) == 2 and c.logprob <= 0 for c in content)


def test_fake_completion_logprobs_and_echo(client):
    r = client.completions.create(
        model=MODEL, prompt="ab", max_tokens=3, temperature=0, logprobs=1, echo=True
    )
    choice = r.choices[0]
    assert choice.text == "abThe"
    assert choice.logprobs.tokens == ["T", "h", "e"]
    assert choice.logprobs.text_offset == [2, 3, 4]


def test_fake_batch_of_prompts_and_token_prompts(client):
    r = client.completions.create(model=MODEL, prompt=["a", "b"], max_tokens=2, temperature=0)
    assert len(r.choices) == 2 and r.usage.prompt_tokens == 2
    r = client.completions.create(model=MODEL, prompt=[104, 105], max_tokens=2, temperature=0)
    assert r.choices[0].text == "Th"


def test_fake_models_health_metrics_stats(fake_server, client):
    ids = [m.id for m in client.models.list().data]
    assert ids[0] == MODEL and MODEL not in ids[1:]  # the served model, then the store's others
    assert httpx.get(fake_server.url + "/health").json()["status"] == "ok"
    text = httpx.get(fake_server.url + "/metrics").text
    for name in (
        "localradix_cache_hit_rate",
        'localradix_kv_tokens{state="free"}',
        "localradix_requests_running",
        "localradix_requests_queued",
        "localradix_prompt_tokens_total",
        "localradix_generation_tokens_total",
        "localradix_cached_tokens_total",
        "localradix_time_to_first_token_seconds_bucket",
        "localradix_inter_token_latency_seconds_bucket",
        "localradix_e2e_request_latency_seconds_count",
    ):
        assert name in text, name
    stats = httpx.get(fake_server.base + "/stats").json()
    assert stats["model"]["name"] == MODEL and stats["engine"]["kv_total"] > 0


def test_fake_stats_stream_sends_events(fake_server):
    with httpx.stream("GET", fake_server.base + "/stats/stream", timeout=5) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = []
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
            if len(events) == 2:
                break
    assert events[1]["uptime_s"] > events[0]["uptime_s"]


def test_fake_openapi_schema(fake_server):
    schema = httpx.get(fake_server.url + "/schema/openapi.json").json()
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"):
        assert path in schema["paths"], path


def test_fake_cache_flush(fake_server):
    assert httpx.post(fake_server.base + "/cache/flush").json() == {"flushed": True}
    with httpx.stream(
        "POST",
        fake_server.base + "/completions",
        json={"model": MODEL, "prompt": "x", "max_tokens": 100000, "stream": True},
    ) as r:
        lines = r.iter_lines()  # keep a reference: a dropped iterator closes the response
        next(lines)
        busy = httpx.post(fake_server.base + "/cache/flush")
    assert busy.status_code == 409 and "running" in busy.json()["error"]["message"]
    assert wait_until(lambda: idle(fake_server))


# ---- bad input: always a clear 4xx in OpenAI's shape, and the server stays healthy ---------

BAD = [
    ("malformed JSON", b'{"model": "fake-model", "messages": [', 400, None),
    ("not an object", b"[1, 2]", 400, None),
    ("empty body", b"", 400, None),
    ("missing messages", {"model": MODEL}, 400, None),
    (
        "wrong type",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"},
        400,
        "max_tokens",
    ),
    ("wrong nested type", {"model": MODEL, "messages": [{"role": 1}]}, 400, "messages[0].role"),
    ("empty messages", {"model": MODEL, "messages": []}, 400, "messages"),
    (
        "unknown model",
        {"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]},
        404,
        "model",
    ),
    (
        "temperature",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": -1},
        400,
        "temperature",
    ),
    (
        "top_p",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_p": 0},
        400,
        "top_p",
    ),
    ("n", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 0}, 400, "n"),
    (
        "max_tokens",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": -5},
        400,
        "max_tokens",
    ),
    (
        "max_completion_tokens",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "x"}],
            "max_completion_tokens": -1,
        },
        400,
        "max_completion_tokens",
    ),
    (
        "top_logprobs",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "x"}],
            "logprobs": True,
            "top_logprobs": 50,
        },
        400,
        "top_logprobs",
    ),
    (
        "penalty",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "presence_penalty": 3},
        400,
        "presence_penalty",
    ),
    (
        "empty stop",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stop": [""]},
        400,
        "stop[0]",
    ),
    (
        "image part",
        {
            "model": MODEL,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "http://x"}}],
                }
            ],
        },
        400,
        "messages[0].content[0].type",
    ),
    (
        "bad role",
        {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]},
        400,
        "messages[0].role",
    ),
    (
        "seed type",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "seed": "abc"},
        400,
        "seed",
    ),
    (
        "huge int",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 10**30},
        400,
        "max_tokens",
    ),
    (
        "huge top_k",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_k": 2**63},
        400,
        "top_k",
    ),
    (
        "bad stop id",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stop_token_ids": [10**9]},
        400,
        "stop_token_ids",
    ),
    ("deep nesting", b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, None),
    ("invalid utf-8", b'{"messages": [{"role": "user", "content": "\xff"}]}', 400, None),
    (
        "nan",
        b'{"model": "fake-model", "messages": [{"role": "user", "content": "x"}], '
        b'"temperature": NaN}',
        400,
        None,
    ),
]


@pytest.mark.parametrize("name,body,status,param", BAD, ids=[b[0] for b in BAD])
def test_fake_bad_chat_input_is_a_clear_4xx(fake_server, name, body, status, param):
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(
        fake_server.base + "/chat/completions",
        headers={"content-type": "application/json"},
        timeout=10,
        **kw,
    )
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param, err
    assert httpx.get(fake_server.url + "/health").status_code == 200


BAD_COMPLETIONS = [
    ({"model": MODEL, "prompt": ""}, "prompt"),
    ({"model": MODEL, "prompt": []}, "prompt"),
    ({"model": MODEL, "prompt": [1, "a"]}, "prompt"),
    ({"model": MODEL, "prompt": [100000]}, "prompt"),
    ({"model": MODEL, "prompt": [-1]}, "prompt[0]"),
    ({"model": MODEL, "prompt": "x", "logprobs": 9}, "logprobs"),
    ({"model": MODEL, "prompt": "x", "suffix": "y"}, "suffix"),
    ({"model": MODEL, "prompt": "x", "best_of": 3}, "best_of"),
    ({"model": MODEL, "prompt": "x", "logit_bias": {"1": 5}}, "logit_bias"),
    ({"model": MODEL, "prompt": "word " * 3000}, "prompt"),  # longer than the context
]


@pytest.mark.parametrize("body,param", BAD_COMPLETIONS)
def test_fake_bad_completion_input_is_a_clear_4xx(fake_server, body, param):
    r = httpx.post(fake_server.base + "/completions", json=body, timeout=10)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_fake_prompt_too_long_says_both_lengths(fake_server):
    r = httpx.post(fake_server.base + "/completions", json={"model": MODEL, "prompt": "x" * 5000})
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "context_length_exceeded"
    assert "5000" in err["message"] and "2048" in err["message"]


def test_fake_unknown_route_and_method(fake_server):
    r = httpx.get(fake_server.base + "/nope")
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.get(fake_server.base + "/chat/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_fake_bad_requests_do_not_disturb_others(fake_server, client):
    def good():
        return client.completions.create(model=MODEL, prompt="x", max_tokens=40, temperature=0)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        goods = [pool.submit(good) for _ in range(4)]
        bads = [
            pool.submit(
                httpx.post, fake_server.base + "/completions", content=b"{garbage", timeout=10
            )
            for _ in range(20)
        ]
        assert all(b.result().status_code == 400 for b in bads)
        assert all(g.result().choices[0].text == greedy(40) for g in goods)


# ---- disconnects abort, limits, lifecycle -------------------------------------------------


def test_fake_streaming_disconnect_aborts(fake_server):
    with httpx.stream(
        "POST",
        fake_server.base + "/completions",
        json={"model": MODEL, "prompt": "x", "max_tokens": 100000, "stream": True},
    ) as r:
        lines = r.iter_lines()
        next(lines)
        assert not idle(fake_server)
    assert wait_until(lambda: idle(fake_server)), httpx.get(fake_server.base + "/stats").json()


def test_fake_non_streaming_disconnect_aborts(fake_server):
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            fake_server.base + "/completions",
            json={"model": MODEL, "prompt": "x", "max_tokens": 100000},
            timeout=0.5,
        )
    assert wait_until(lambda: idle(fake_server)), httpx.get(fake_server.base + "/stats").json()


def test_fake_full_queue_answers_429_with_retry_after():
    server = start_server(["--max-running-requests", "1", "--max-queued-requests", "1"], fake=True)
    try:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 100000, "stream": True}
        with (
            httpx.stream("POST", server.base + "/completions", json=body) as a,
            httpx.stream("POST", server.base + "/completions", json=body) as b,
        ):
            assert a.status_code == b.status_code == 200
            r = httpx.post(server.base + "/completions", json=body)
            assert r.status_code == 429 and r.headers["retry-after"] == "1"
            assert r.json()["error"]["code"] == "rate_limit_exceeded"
        assert wait_until(lambda: idle(server))
        assert (
            httpx.post(
                server.base + "/completions", json={**body, "stream": False, "max_tokens": 2}
            ).status_code
            == 200
        )
        # More sequences than the server ever holds: a 400 naming n, even when idle.
        r = httpx.post(server.base + "/completions", json={**body, "stream": False, "n": 3})
        assert r.status_code == 400 and "retry-after" not in r.headers, r.text
        assert r.json()["error"]["param"] == "n" and "lower n" in r.json()["error"]["message"]
    finally:
        assert server.stop() == 0


def _crash(server) -> httpx.Response:
    body = {"model": MODEL, "prompt": "CRASH", "max_tokens": 5}
    return httpx.post(server.base + "/completions", json=body, timeout=10)


def _served(server) -> bool:
    body = {"model": MODEL, "prompt": "fine", "max_tokens": 3}
    return httpx.post(server.base + "/completions", json=body, timeout=10).status_code == 200


@pytest.mark.slow  # seconds of e2e work
def test_fake_engine_crash_gives_503_then_a_restarted_engine_serves():
    server = start_server([], fake=True)
    try:
        for restart in (1, 2):
            r = _crash(server)
            assert r.status_code == 503, r.text
            assert "engine process exited" in r.json()["error"]["message"]
            health = httpx.get(server.url + "/health")
            if health.status_code == 503:  # while it restarts: says so, with Retry-After
                assert "restarting" in health.json()["error"]["message"]
            assert wait_until(lambda: _served(server), timeout=30), server.log()[-2000:]
            assert httpx.get(server.url + "/health").json()["engine_restarts"] == restart
        assert "restarting it in" in server.log() and "serving again" in server.log()
    finally:
        assert server.stop() == 0, server.log()[-2000:]


@pytest.mark.slow  # seconds of e2e work
def test_fake_engine_crash_with_no_restarts_left_exits_nonzero():
    server = start_server(["--engine-restarts", "0"], fake=True)
    try:
        r = _crash(server)
        assert r.status_code == 503, r.text
        assert "engine process exited" in r.json()["error"]["message"]
        assert server.proc.wait(15) == 1
    finally:
        server.stop(signal.SIGKILL)


@pytest.mark.slow  # seconds of e2e work
def test_fake_sigterm_drains_in_flight_and_exits_zero():
    server = start_server([], fake=True, env={"FAKE_STEP_DELAY_S": "0.01"})
    result = {}

    def run():
        result["r"] = httpx.post(
            server.base + "/completions",
            json={"model": MODEL, "prompt": "x", "max_tokens": 50, "temperature": 0},
            timeout=30,
        )

    t = threading.Thread(target=run)
    t.start()
    in_flight = lambda: httpx.get(server.base + "/stats").json()["server"]["in_flight"]  # noqa: E731
    assert wait_until(lambda: in_flight() == 1, timeout=30)  # in flight, not merely sent
    assert server.stop(signal.SIGTERM) == 0
    t.join()
    assert result["r"].status_code == 200 and result["r"].json()["choices"][0]["text"]
    assert "Traceback" not in server.log()


@pytest.mark.slow  # seconds of e2e work
def test_fake_sigint_aborts_long_streams_after_the_drain_timeout():
    server = start_server(["--drain-timeout", "3"], fake=True)
    with httpx.stream(
        "POST",
        server.base + "/completions",
        json={"model": MODEL, "prompt": "x", "max_tokens": 10**6, "stream": True},
        timeout=30,
    ) as r:
        lines = r.iter_lines()
        next(lines)
        start = time.monotonic()
        server.proc.send_signal(signal.SIGINT)
        try:
            for _ in lines:
                pass
        except httpx.HTTPError:
            pass
    assert server.proc.wait(20) == 0
    assert time.monotonic() - start < 15


def test_fake_api_key_and_cors():
    server = start_server(
        ["--api-key", "sekret", "--cors-origins", "http://app.example"], fake=True
    )
    try:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
        r = httpx.post(server.base + "/completions", json=body)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = httpx.post(
            server.base + "/completions", json=body, headers={"Authorization": "Bearer wrong"}
        )
        assert r.status_code == 401
        r = httpx.post(
            server.base + "/completions", json=body, headers={"Authorization": "Bearer sekret"}
        )
        assert r.status_code == 200
        assert httpx.get(server.url + "/health").status_code == 200
        pre = httpx.options(
            server.base + "/completions",
            headers={"Origin": "http://app.example", "Access-Control-Request-Method": "POST"},
        )
        assert pre.headers.get("access-control-allow-origin") == "http://app.example"
    finally:
        server.stop()


def test_fake_no_cors_by_default_and_body_limit():
    server = start_server(["--max-body-bytes", "2000"], fake=True)
    try:
        r = httpx.post(
            server.base + "/completions",
            json={"model": MODEL, "prompt": "x"},
            headers={"Origin": "http://evil.example"},
        )
        assert "access-control-allow-origin" not in r.headers
        r = httpx.post(server.base + "/completions", json={"model": MODEL, "prompt": "x" * 5000})
        assert r.status_code == 413 and "too large" in r.json()["error"]["message"]
        assert httpx.get(server.url + "/health").status_code == 200
    finally:
        server.stop()


def test_fake_load_failure_exits_nonzero_with_the_reason():
    import subprocess
    import sys

    from server_harness import REPO

    r = subprocess.run(
        [sys.executable, "-m", "localradix", "serve", "/nonexistent/model.gguf", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert r.returncode == 1
    assert "nonexistent" in r.stdout + r.stderr


@pytest.mark.slow
def test_fake_schemathesis_cli_all_checks_pass(fake_server):
    """The schemathesis CLI, all phases and all checks (no 5xx, every status, content type,
    header and body as documented, schema-valid requests accepted and invalid ones refused,
    a deleted response gone), against the server's own OpenAPI document. The deliberate
    exclusions are listed with their reasons in schemathesis.toml."""
    import os
    import shutil
    import subprocess
    import sys

    exe = shutil.which("schemathesis", path=os.path.dirname(sys.executable))
    if exe is None:
        pytest.skip("schemathesis is not installed")
    cmd = [
        exe,
        "--config-file",
        str(Path(__file__).with_name("schemathesis.toml")),
        "run",
        fake_server.url + "/schema/openapi.json",
        "--checks",
        "all",
        "--max-examples",
        "25",
        "--request-timeout",
        "90",  # see max_response_time in schemathesis.toml
        "--seed",
        "1",
        "--workers",
        "2",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
    assert wait_until(lambda: idle(fake_server), timeout=30)


@pytest.mark.slow  # seconds of e2e work
@pytest.mark.parametrize("impl", ["h11", "httptools"])
def test_fake_disconnects_abort_with_either_http_implementation(impl):
    pytest.importorskip(impl)
    server = start_server([], fake=True, env={"LOCALRADIX_UVICORN_HTTP": impl})
    try:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 100000}
        with httpx.stream("POST", server.base + "/completions", json={**body, "stream": True}) as r:
            lines = r.iter_lines()
            next(lines)
            assert not idle(server)
        assert wait_until(lambda: idle(server))
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.base + "/completions", json=body, timeout=0.5)
        assert wait_until(lambda: idle(server))
        r = httpx.post(server.base + "/completions", json={**body, "max_tokens": 3})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    finally:
        assert server.stop() == 0
