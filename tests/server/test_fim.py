"""Fill-in-the-middle: the FIM tokens found from the tokenizer, the prompt layout, and the three
routes (OpenAI `suffix`, Ollama `suffix`, llama.cpp `/infill`) served for real on a tiny
random-weight model that has FIM tokens; the bundled model (none) gets a clear 400."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from server_harness import start_server

from localradix.loader.tokenizer import Tokenizer
from localradix.server.core.fim import FimTokens, fim_prompt, fim_tokens, repo_context

pytestmark = pytest.mark.slow  # seconds of e2e work: the full suite runs it, the fast tier does not

VOCAB = 512
SPECIALS = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>"]
PRE, SUF, MID, REP, SEP = range(VOCAB - len(SPECIALS), VOCAB)


def fim_tokenizer_json(path: Path, specials: list[str]) -> None:
    """A word-level tokenizer (word "wN" is id N) with the FIM tokens added after it."""
    from tokenizers import AddedToken, models, pre_tokenizers
    from tokenizers import Tokenizer as Backend

    vocab = {f"w{i}": i for i in range(VOCAB - len(specials))}
    tok = Backend(models.WordLevel(vocab=vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(s, special=True) for s in specials])
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "w1"}))


# ---- units: the tokens and the layout -------------------------------------------------------


def test_fim_tokens_found_from_added_special_tokens(tmp_path):
    fim_tokenizer_json(tmp_path, SPECIALS)
    assert fim_tokens(Tokenizer.from_folder(tmp_path)) == FimTokens(PRE, SUF, MID, REP, SEP)


def test_no_fim_tokens_is_none(tmp_path):
    fim_tokenizer_json(tmp_path, [])
    assert fim_tokens(Tokenizer.from_folder(tmp_path)) is None


def test_gguf_fim_metadata_names_the_tokens(tmp_path):
    """A GGUF's tokenizer.ggml.fim_*_token_id arrive as fim_pre_token, ... special tokens."""
    fim_tokenizer_json(tmp_path, ["<A>", "<B>", "<C>"])
    config = {"eos_token": "w1", "fim_pre_token": "<A>", "fim_suf_token": "<B>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "fim_mid_token": "<C>"}))
    assert fim_tokens(Tokenizer.from_folder(tmp_path)) == FimTokens(509, 510, 511)


def test_fim_prompt_is_prefix_suffix_middle_then_the_typed_middle():
    fim = FimTokens(100, 101, 102)
    assert fim_prompt(fim, [1, 2], [3], context=[7], after_middle=[9]) == [
        7,
        100,
        1,
        2,
        101,
        3,
        102,
        9,
    ]


def test_repo_context_uses_repo_and_file_separator_tokens_when_present():
    encode = {"myproject\n": [50], "a.py\n": [51], "x = 1": [52], "filename\n": [53]}.__getitem__
    with_repo = FimTokens(100, 101, 102, repo=103, file_sep=104)
    assert repo_context(with_repo, encode, [("a.py", "x = 1")]) == [103, 50, 104, 51, 52, 104, 53]
    snippet = {"\n\n--- snippet ---\n\n": [60], "x = 1": [52]}.__getitem__
    assert repo_context(FimTokens(100, 101, 102), snippet, [("a.py", "x = 1")]) == [60, 52]


# ---- served for real: a tiny random-weight model with FIM tokens ----------------------------


@pytest.fixture(scope="module")
def fim_server(tmp_path_factory):
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        eos_token_id=1, bos_token_id=2, tie_word_embeddings=True,
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("tiny-fim")
    transformers.LlamaForCausalLM(config).eval().save_pretrained(folder)
    fim_tokenizer_json(folder, SPECIALS)
    s = start_server([str(folder), "--backend", "cpu", "--max-total-tokens", "4096"], fake=False)
    yield s
    s.stop()


def test_openai_suffix_builds_the_fim_prompt_from_the_models_tokens(fim_server):
    body = {"prompt": "w5 w6", "suffix": "w7", "max_tokens": 2, "temperature": 0, "echo": True}
    r = httpx.post(fim_server.base + "/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["usage"]["prompt_tokens"] == 6  # PRE w5 w6 SUF w7 MID
    assert out["choices"][0]["text"].startswith(
        "<|fim_prefix|> w5 w6 <|fim_suffix|> w7 <|fim_middle|>"
    )


def test_ollama_suffix_and_the_insert_capability(fim_server):
    model = httpx.get(fim_server.base + "/models").json()["data"][0]["id"]
    body = {"model": model, "prompt": "w5 w6", "suffix": "w7", "stream": False}
    body["options"] = {"num_predict": 2, "temperature": 0}
    r = httpx.post(fim_server.url + "/api/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert len(r.json()["context"]) - r.json()["eval_count"] == 6  # the prompt's ids
    # A gap at the start of a file: no text before it (PRE SUF w7 MID).
    r = httpx.post(fim_server.url + "/api/generate", json={**body, "prompt": ""}, timeout=120)
    assert r.status_code == 200 and len(r.json()["context"]) - r.json()["eval_count"] == 4
    show = httpx.post(fim_server.url + "/api/show", json={"model": model}, timeout=30).json()
    assert "insert" in show["capabilities"]


def test_infill_lays_out_the_repo_files_as_llama_cpp_does(fim_server):
    body = {
        "input_prefix": "w5 w6",
        "input_suffix": "w7",
        "input_extra": [{"filename": "a.py", "text": "w9 w10"}],
        "prompt": "w11",
        "n_predict": 2,
        "temperature": 0,
    }
    r = httpx.post(fim_server.url + "/infill", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    # REP myproject SEP a.py w9 w10 SEP filename | PRE w5 w6 SUF w7 MID w11
    assert out["tokens_evaluated"] == 8 + 7
    assert out["tokens_predicted"] == 2 and out["stop_type"] == "limit"
    assert isinstance(out["content"], str)

    # Streamed (llama.vscode asks so): the same text in SSE pieces, then the counts.
    with httpx.stream("POST", fim_server.url + "/infill", json={**body, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True, events
    assert "".join(e["content"] for e in events) == out["content"]
    assert events[-1]["tokens_predicted"] == 2 and events[-1]["tokens_evaluated"] == 8 + 7


def test_a_client_built_fim_prompt_with_16_stops_is_a_plain_completion(fim_server):
    prompt = "<|fim_prefix|> w5 w6 <|fim_suffix|> w7 <|fim_middle|>"
    stops = [f"w{i}" for i in range(300, 316)]
    body = {"prompt": prompt, "stop": stops, "max_tokens": 2, "temperature": 0, "echo": True}
    r = httpx.post(fim_server.base + "/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 6  # the FIM tokens as the model's own ids


# ---- the bundled model has no FIM tokens: a clear 400 on each route --------------------------


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/completions", {"prompt": "def f(", "suffix": "return x", "max_tokens": 2}),
        ("/api/generate", {"prompt": "def f(", "suffix": "return x", "stream": False}),
        ("/infill", {"input_prefix": "def f(", "input_suffix": "return x"}),
    ],
)
def test_a_model_without_fim_tokens_gets_a_400_that_says_so(server, path, body):
    model = httpx.get(server.base + "/models").json()["data"][0]["id"]
    r = httpx.post(server.url + path, json={**body, "model": model}, timeout=60)
    assert r.status_code == 400, r.text
    assert "no FIM tokens" in r.text
