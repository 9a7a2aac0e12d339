"""`POST /tokenize` and `POST /detokenize` on a real server with the bundled SmolLM2 GGUF: ids
equal llama.cpp's own `llama_tokenize` on the same file, pieces and detokenize round trips,
chat messages tokenize to exactly what the chat route counts, and bad input is a 4xx JSON error.
SmolLM2's rule adds no BOS, so every form of a text gives the same ids."""

from __future__ import annotations

import httpx
import pytest

from localradix.store.bundled import find_bundled

pytestmark = pytest.mark.slow

TEXTS = [
    "Hello world",
    "a\n\nb",
    "  two leading spaces, then 123456 digits",
    "<|im_start|>user\nhi<|im_end|>\n",  # special tokens' text: matched as those tokens
    "naïve café 🦊 日本語",
]
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def post(server, path: str, body: object) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120)


def tokenize(server, **body: object) -> dict:
    r = post(server, "/tokenize", body)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def llama_tokenize():
    """llama.cpp's own tokenizer on the bundled GGUF (its vocabulary only), through the C API."""
    import llama_cpp.llama_cpp as llama

    llama.llama_backend_init()
    params = llama.llama_model_default_params()
    params.vocab_only = True
    model = llama.llama_model_load_from_file(str(find_bundled()).encode(), params)
    assert model, "llama.cpp could not load the bundled GGUF's vocabulary"
    vocab = llama.llama_model_get_vocab(model)

    def run(text: str, add_special: bool) -> list[int]:
        data = text.encode("utf-8")
        size = len(data) + 8
        out = (llama.llama_token * size)()
        n = llama.llama_tokenize(vocab, data, len(data), out, size, add_special, True)
        assert n >= 0
        return list(out[:n])

    yield run
    llama.llama_model_free(model)


@pytest.mark.parametrize("text", TEXTS)
def test_ids_equal_llama_cpps_own_tokenizer(server, llama_tokenize, text):
    assert tokenize(server, content=text)["tokens"] == llama_tokenize(text, False)
    # add_special: BOS by the model's rule (SmolLM2's adds none), as llama_tokenize does
    expected = llama_tokenize(text, True)
    assert tokenize(server, content=text, add_special=True)["tokens"] == expected
    assert tokenize(server, prompt=text)["tokens"] == expected  # vLLM's default: add them


def test_the_answer_carries_vllms_count_and_max_model_len(server):
    out = tokenize(server, content="Hello world")
    assert out["count"] == len(out["tokens"]) == 2
    model = httpx.get(server.base + "/models").json()["data"][0]
    assert out["max_model_len"] == model["max_model_len"] > 0
    assert tokenize(server, content="")["tokens"] == []


def test_pieces_of_ascii_join_to_the_text(server):
    text = "Hello world, how are you today?"
    out = tokenize(server, content=text, with_pieces=True)
    pieces = out["tokens"]
    assert all(isinstance(p["id"], int) and isinstance(p["piece"], str) for p in pieces)
    assert "".join(p["piece"] for p in pieces) == text
    assert [p["id"] for p in pieces] == tokenize(server, content=text)["tokens"]


def test_pieces_of_an_emoji_split_over_tokens_are_byte_lists(server):
    """🦊 is 4 UTF-8 bytes over several byte-level tokens: no piece is valid UTF-8 alone, so
    each is a list of byte values (llama-server's shape); together they are the emoji's bytes."""
    text = "🦊 fox"
    pieces = tokenize(server, content=text, with_pieces=True)["tokens"]
    raw = [
        bytes(p["piece"]) if isinstance(p["piece"], list) else p["piece"].encode() for p in pieces
    ]
    assert b"".join(raw) == text.encode("utf-8")
    lists = [p["piece"] for p in pieces if isinstance(p["piece"], list)]
    assert lists and all(all(0 <= b < 256 for b in piece) for piece in lists)
    assert pieces[-1]["piece"] == " fox"


@pytest.mark.parametrize("text", TEXTS)
def test_detokenize_round_trips(server, text):
    ids = tokenize(server, content=text)["tokens"]
    r = post(server, "/detokenize", {"tokens": ids})
    assert r.status_code == 200, r.text
    assert r.json() == {"content": text, "prompt": text}


def test_messages_are_the_ids_the_chat_route_counts(server, client, model):
    ids = tokenize(server, messages=QUESTION, model=model)["tokens"]
    chat = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=1)
    assert chat.usage.prompt_tokens == len(ids)
    # The same text through the template by hand, tokenized as a prompt: the same ids.
    from localradix.loader.tokenizer_choice import load_tokenizer

    tok = load_tokenizer(None)
    rendered = tok.apply_chat_template(QUESTION, add_generation_prompt=True)
    assert ids == tokenize(server, prompt=rendered)["tokens"]
    without = tokenize(server, messages=QUESTION, add_generation_prompt=False)["tokens"]
    assert ids[: len(without)] == without and len(without) < len(ids)


def test_messages_with_tools_render_them(server):
    tools = [
        {
            "type": "function",
            "function": {"name": "get_weather", "parameters": {"type": "object"}},
        }
    ]
    plain = tokenize(server, messages=QUESTION)["count"]
    assert tokenize(server, messages=QUESTION, tools=tools)["count"] >= plain


def test_every_route_counts_a_prompt_as_tokenize_does(server, client, model):
    """SmolLM2 adds no BOS: a completion's prompt is its text's ids, and the other dialects
    count the same chat prompt as /tokenize of the messages."""
    text = "The capital of France is"
    ids = tokenize(server, prompt=text)["tokens"]
    assert ids == tokenize(server, content=text)["tokens"]  # no BOS by SmolLM2's rule
    done = client.completions.create(model=model, prompt=text, max_tokens=1, echo=True)
    assert done.usage.prompt_tokens == len(ids)
    assert done.choices[0].text.startswith(text)
    chat_ids = tokenize(server, messages=QUESTION)["tokens"]
    body = {"model": model, "prompt": QUESTION[0]["content"], "stream": False}
    generated = post(server, "/api/generate", {**body, "options": {"num_predict": 1}}).json()
    assert len(generated["context"]) - generated["eval_count"] == len(chat_ids)
    assert generated["context"][: len(chat_ids)] == chat_ids  # then the output's ids
    counted = post(server, "/v1/messages/count_tokens", {"model": model, "messages": QUESTION})
    assert counted.json()["input_tokens"] == len(chat_ids)


ERRORS = [
    ("/tokenize", {}),
    ("/tokenize", {"content": 5}),
    ("/tokenize", {"content": "a", "prompt": "b"}),
    ("/tokenize", {"content": "a", "with_pieces": "yes"}),
    ("/tokenize", {"content": "a", "add_special": "no"}),
    ("/tokenize", {"messages": []}),
    ("/tokenize", {"messages": "hi"}),
    ("/tokenize", {"messages": [{"role": "wizard", "content": "hi"}]}),
    ("/tokenize", {"messages": QUESTION, "chat_template_kwargs": {"messages": []}}),
    ("/tokenize", {"content": "a", "model": "no-such-model"}),
    ("/tokenize", [1, 2]),
    ("/detokenize", {}),
    ("/detokenize", {"tokens": "abc"}),
    ("/detokenize", {"tokens": [1, "2"]}),
    ("/detokenize", {"tokens": [1.5]}),
    ("/detokenize", {"tokens": [-1]}),
    ("/detokenize", {"tokens": [49152]}),  # one past SmolLM2's vocabulary
    ("/detokenize", {"tokens": [2**70]}),
    ("/detokenize", {"tokens": [0] * ((1 << 20) + 1)}),
    ("/detokenize", {"tokens": [1], "model": "no-such-model"}),
]


@pytest.mark.parametrize("path,body", ERRORS)
def test_bad_input_is_a_4xx_openai_error(server, path, body):
    r = post(server, path, body)
    assert 400 <= r.status_code < 500, r.text
    error = r.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"]


def test_a_body_that_is_not_json_is_a_400(server):
    for path in ("/tokenize", "/detokenize"):
        r = httpx.post(server.url + path, content=b"{not json", timeout=30)
        assert r.status_code == 400 and "error" in r.json(), r.text


def test_out_of_range_ids_name_the_token(server):
    r = post(server, "/detokenize", {"tokens": [1, 2, 99999]})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "tokens[2]"


def test_both_routes_are_in_the_openapi_document_with_their_bodies(server):
    schema = httpx.get(server.url + "/schema/openapi.json", timeout=30).json()
    for path, name in (("/tokenize", "TokenizeBody"), ("/detokenize", "DetokenizeBody")):
        body = schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert body["schema"]["$ref"].endswith("/" + name)
        assert name in schema["components"]["schemas"]
    assert "/v1/tokenize" not in schema["paths"]
