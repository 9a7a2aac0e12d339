"""The disk tier as a user meets it: a model unloaded by keep_alive and a server restarted
both find a long prompt's KV on disk (usage reports it cached) and answer as a cold server.

The default model is a tiny random Llama (the default never unloads); the bundled model is
asked for by name, so the pool loads and unloads it, all on the torch CPU runner.
"""

from __future__ import annotations

import signal
import stat

import httpx
import pytest
from engine.conftest import _hf_config, _word_level_tokenizer
from server_harness import start_server, wait_until

BUNDLED = "smollm2:135m-q4_1"
CHUNK = 32


@pytest.fixture(scope="module")
def tiny_default(tmp_path_factory):
    import torch

    torch.manual_seed(0)
    config, cls = _hf_config("llama")
    folder = tmp_path_factory.mktemp("tiny-default")
    cls(config).save_pretrained(folder)
    _word_level_tokenizer(folder)
    return folder


def ask(url: str, document: str, question: str) -> tuple[str, int, int]:
    """(answer, prompt tokens, cached tokens) of one greedy chat on the bundled model."""
    body = {
        "model": BUNDLED,
        "messages": [
            {"role": "system", "content": "Answer from this report.\n" + document},
            {"role": "user", "content": question},
        ],
        "temperature": 0,
        "max_tokens": 12,
    }

    def post():
        response = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
        return None if response.status_code == 503 else response  # still unloading: retry

    response = wait_until(post, timeout=60, interval=0.5)
    assert response is not None and response.status_code == 200, response and response.text
    reply = response.json()
    usage = reply["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    return reply["choices"][0]["message"]["content"], usage["prompt_tokens"], cached


@pytest.mark.slow
def test_unload_and_restart_find_the_prompt_on_disk(tiny_default, tmp_path):
    disk = tmp_path / "kv"
    args = [str(tiny_default), "--backend", "cpu", "--kv-disk-cache", str(disk),
            "--kv-disk-gib", "1", "--max-total-tokens", "8192"]  # fmt: skip
    document = " ".join(f"Station {i} logged {i * 7 % 31} millimetres of rain." for i in range(70))
    server = start_server(args, fake=False)
    try:
        cold, prompt_tokens, cached = ask(server.url, document, "Which station was wettest?")
        assert cached == 0 and prompt_tokens > 700
        # keep_alive 0 unloads it; its engine writes the cache to disk as it stops.
        unload = {"model": BUNDLED, "prompt": "", "keep_alive": 0}
        assert (
            httpx.post(server.url + "/api/generate", json=unload, timeout=120).json()["done_reason"]
            == "unload"
        )
        gone = wait_until(lambda: BUNDLED not in httpx.get(server.url + "/api/ps").text, 60)
        assert gone, "keep_alive 0 did not unload the model"
        reloaded, _, cached = ask(server.url, document, "Which station was driest?")
        files = list(disk.rglob("*.kv"))
        assert files and all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
        assert cached >= 5 * CHUNK  # the shared system prompt, whole chunks of it
        stats = httpx.get(server.url + "/v1/stats", timeout=10).json()
        assert "kv_tiers" in str(stats)
    finally:
        assert server.stop(signal.SIGINT) == 0, server.log()[-3000:]
    server = start_server(args, fake=False)  # a restart
    try:
        again, _, cached = ask(server.url, document, "Which station was wettest?")
        assert cached >= (prompt_tokens - 64) // CHUNK * CHUNK  # all but the question's chunks
        assert again == cold
    finally:
        assert server.stop(signal.SIGINT) == 0, server.log()[-3000:]
