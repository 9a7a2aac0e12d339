"""Embeddings served for real on a tiny random-weight Qwen3 embedding model (built in the test),
through the unchanged `openai` SDK (`embeddings.create`) and `ollama` client (`embed`,
`embeddings`), against transformers' vectors on the same weights."""

from __future__ import annotations

import httpx
import numpy as np
import ollama
import openai
import pytest
from engine.embedding_model import reference_embedding, save_embedding_model
from server_harness import start_server

TEXTS = ["w5 w6 w7", "w9 w10 w11 w12 w13 w14 w15 w16 w17 w18 w19 w20", "w300"]


def _ids(text: str) -> list[int]:
    """The word-level tokenizer: "wN" is id N, and the EOS (id 1) ends every text."""
    return [int(w[1:]) for w in text.split()] + [1]


@pytest.fixture(scope="module")
def embed_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-embedding")
    hf = save_embedding_model(folder, pooling="last", normalize=True)
    args = [str(folder), "--backend", "cpu", "--dtype", "float32", "--max-total-tokens", "2048"]
    s = start_server(args + ["--chunked-prefill-size", "8"], fake=False)
    yield s, hf
    assert s.stop() == 0, s.log()[-3000:]


def _ref(hf, text: str) -> np.ndarray:
    return np.array(reference_embedding(hf, _ids(text), "last", normalize=True))


def _close(got, want) -> None:
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=1e-4, atol=1e-5)


def test_openai_sdk_embeddings_match_transformers(embed_server):
    server, hf = embed_server
    client = openai.OpenAI(base_url=server.base, api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    out = client.embeddings.create(model=model, input=TEXTS)  # the SDK asks for base64
    assert [d.index for d in out.data] == [0, 1, 2]
    for d, text in zip(out.data, TEXTS):
        _close(d.embedding, _ref(hf, text))
    total = sum(len(_ids(t)) for t in TEXTS)
    assert out.usage.prompt_tokens == out.usage.total_tokens == total
    floats = client.embeddings.create(model=model, input=TEXTS[0], encoding_format="float")
    _close(floats.data[0].embedding, _ref(hf, TEXTS[0]))
    by_ids = client.embeddings.create(model=model, input=[[5, 6], [9, 10, 11]])  # as given
    _close(by_ids.data[1].embedding, reference_embedding(hf, [9, 10, 11], "last", True))
    one_list = client.embeddings.create(model=model, input=[300, 301])
    _close(one_list.data[0].embedding, reference_embedding(hf, [300, 301], "last", True))
    assert one_list.usage.prompt_tokens == 2


def test_dimensions_truncate_and_renormalise(embed_server):
    server, hf = embed_server
    body = {"input": TEXTS[1], "dimensions": 16, "encoding_format": "float"}
    r = httpx.post(server.base + "/embeddings", json=body, timeout=60)
    assert r.status_code == 200, r.text
    head = _ref(hf, TEXTS[1])[:16]
    _close(r.json()["data"][0]["embedding"], head / np.linalg.norm(head))
    r = httpx.post(server.base + "/embeddings", json={**body, "dimensions": 65}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "dimensions", r.text


def test_bad_inputs_are_400s(embed_server):
    server, _ = embed_server
    long = "w5 " * 600  # past the 512-token context
    for body in (
        {"input": long},
        {"input": ""},
        {"input": []},
        {"input": ["w5", 5]},
        {"input": "w5", "encoding_format": "int8"},
        {"input": "w5", "model": "nope"},
        {"input": [[5, 999999]]},
    ):
        r = httpx.post(server.base + "/embeddings", json=body, timeout=60)
        assert 400 <= r.status_code < 500, (body, r.text)
        assert r.json()["error"]["message"], r.text


def test_ollama_client_embed_and_embeddings(embed_server):
    server, hf = embed_server
    oc = ollama.Client(host=server.url)
    model = oc.list().models[0].model
    out = oc.embed(model=model, input=TEXTS)
    for vector, text in zip(out.embeddings, TEXTS):
        _close(vector, _ref(hf, text))
    assert out.prompt_eval_count == sum(len(_ids(t)) for t in TEXTS)
    assert out.total_duration and out.total_duration > 0
    single = oc.embed(model=model, input=TEXTS[0])
    _close(single.embeddings[0], _ref(hf, TEXTS[0]))
    legacy = oc.embeddings(model=model, prompt=TEXTS[1])
    _close(legacy.embedding, _ref(hf, TEXTS[1]))
    assert oc.show(model).capabilities == ["embedding"]
    r = httpx.post(server.url + "/api/embed", json={"model": model, "input": []}, timeout=30)
    assert r.status_code == 200 and r.json()["embeddings"] == []  # as Ollama: only loads
    r = httpx.post(server.url + "/api/embed", json={"model": model, "input": "w5", "dimensions": 0})
    assert r.status_code == 400 and "dimensions" in r.json()["error"]


def test_ollama_truncate_cuts_an_overlong_input_unless_told_not_to(embed_server):
    server, _ = embed_server
    oc = ollama.Client(host=server.url)
    model = oc.list().models[0].model
    long = "w5 " * 600
    out = oc.embed(model=model, input=long)  # Ollama truncates by default
    assert out.prompt_eval_count == 511 and len(out.embeddings[0]) == 64
    with pytest.raises(ollama.ResponseError) as err:
        oc.embed(model=model, input=long, truncate=False)
    assert err.value.status_code == 400 and "context length" in err.value.error


def test_an_embedding_model_does_not_generate(embed_server):
    server, _ = embed_server
    r = httpx.post(server.base + "/completions", json={"prompt": "w5", "max_tokens": 2}, timeout=30)
    assert r.status_code == 400 and "embedding model" in r.json()["error"]["message"], r.text
    oc = ollama.Client(host=server.url)
    with pytest.raises(ollama.ResponseError) as err:
        oc.generate(model=oc.list().models[0].model, prompt="w5", raw=True)
    assert err.value.status_code == 400 and "cannot generate" in err.value.error
