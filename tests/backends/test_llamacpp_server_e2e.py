"""`localradix serve --backend llamacpp` passes the server's end-to-end suites.

The tests of tests/server/test_e2e_real.py (OpenAI SDK, streaming, tools, aborts, the KV leak
check) and test_structured_e2e.py (JSON schema, regex, forced tool calls) are imported here and
run against a server started with `--backend llamacpp` (this module's `server` fixture
overrides theirs). The engine-death tests are left out: they start their own server and test the
server, not the backend.
"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from .conftest import HAS_LLAMA_CPP

SERVER_TESTS = str(Path(__file__).resolve().parent.parent / "server")
if SERVER_TESTS not in sys.path:
    sys.path.insert(0, SERVER_TESTS)

if HAS_LLAMA_CPP:
    import test_structured_e2e as structured
    from server_harness import client, model, start_server  # noqa: F401 (fixtures)
    from test_e2e_real import *  # noqa: F403  (the suite: tests and their fixtures)
    from test_structured_e2e import *  # noqa: F403

    del test_engine_death_gives_503_and_a_nonzero_exit  # noqa: F821
    del test_engine_death_gives_503_then_a_restart_and_serves_again  # noqa: F821
    # These three pin the torch path's answer ("The capital of France is Paris."), which
    # llama.cpp's Q4_1 kernels (activations quantized to 8 bits) do not give for this prompt,
    # and a seed reproduced across a cache hit; their llama.cpp versions are below.
    del test_chat_greedy, test_stop_string, test_n_and_seed_reproducibility  # noqa: F821
    # Its unbounded JSON object closes within max_tokens only for some of llama.cpp's rounding
    # (which moves with where cells sit, i.e. with what ran before): checked from a flush below.
    del test_json_object_parses  # noqa: F821

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not HAS_LLAMA_CPP, reason="llama-cpp-python is not installed (localradix[llamacpp])"
    ),
]


@pytest.fixture(scope="module")
def server():
    s = start_server(
        ["--backend", "llamacpp", "--max-total-tokens", "16384", "--max-running-requests", "16"],
        fake=False,
    )
    yield s
    assert s.stop() == 0, s.log()[-3000:]


PROMPT = "Once upon a time, in a village by the sea,"
CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def reference_text():
    """llama.cpp's own greedy continuation of PROMPT (llama-cpp-python, one sequence)."""
    import logging

    from llama_cpp import Llama

    from localradix.loader import load_tokenizer, resolve_model

    source = resolve_model(None)
    tokenizer = load_tokenizer(source)
    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
    llm = Llama(model_path=str(source.path), n_ctx=512, n_threads=2, flash_attn=True, verbose=False)
    tokens: list[int] = []
    for token in llm.generate(tokenizer.encode(PROMPT), temp=0.0, reset=True):
        tokens.append(int(token))
        if len(tokens) == 16:
            break
    llm.close()
    return tokenizer.decode(tokens)


def _flush(server) -> None:
    """Same cache state, same cells: llama.cpp's sums then run in the same order."""
    assert httpx.post(server.base + "/cache/flush", timeout=30).status_code == 200


def test_greedy_completion_is_llama_cpps_own(server, client, model, reference_text):
    _flush(server)
    kw = dict(model=model, prompt=PROMPT, max_tokens=16, temperature=0)
    r = client.completions.create(**kw, extra_body={"ignore_eos": True})
    assert r.choices[0].text == reference_text


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_cuts_llama_cpps_text(server, client, model, reference_text, stream):
    word = reference_text.split()[2]
    kw = dict(model=model, prompt=PROMPT, max_tokens=16, temperature=0, stop=[word])
    _flush(server)
    if stream:
        chunks = client.completions.create(stream=True, **kw)
        text = "".join(c.choices[0].text for c in chunks if c.choices)
    else:
        r = client.completions.create(**kw)
        text = r.choices[0].text
        assert r.choices[0].finish_reason == "stop"
    assert text == reference_text[: reference_text.index(word)]


def test_a_seed_reproduces_from_the_same_cache_state(server, client, model):
    kw = dict(model=model, messages=CAPITAL, max_tokens=6, temperature=1.0, seed=1234, n=3)
    _flush(server)
    a = client.chat.completions.create(**kw)
    _flush(server)
    b = client.chat.completions.create(**kw)
    texts = [c.message.content for c in a.choices]
    assert texts == [c.message.content for c in b.choices] and all(texts)


def test_json_object_parses_from_a_flushed_cache(server, client, model):
    _flush(server)
    structured.test_json_object_parses(client, model)


def test_the_server_runs_on_llamacpp(server):
    assert "Backend llamacpp" in server.log()
    assert "llama.cpp: llama" in server.log()
