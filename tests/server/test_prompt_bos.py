"""BOS by the model's own rule on every route: a tiny random-weight model whose tokenizer.json
post-processor adds BOS (as Llama and Mistral tokenizers do), served for real and run in-process.
Every prompt starts with exactly one BOS: text prompts get it, a chat template that writes it
itself does not get a second, token-id prompts stay as the client gave them, and every route's
prompt count equals /tokenize's. (The bundled SmolLM2, whose rule adds none, is checked in
test_tokenize_routes.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from server_harness import start_server

pytestmark = pytest.mark.slow

VOCAB = 512
SPECIALS = ["<s>", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]
BOS, PRE, SUF, MID = range(VOCAB - len(SPECIALS), VOCAB)
# Writes BOS itself, as Llama 3's and Mistral's templates do.
TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m['content'] }} {% endfor %}"
USER = [{"role": "user", "content": "w5 w6"}]


def write_tokenizer(folder: Path) -> None:
    """A word-level tokenizer (word "wN" is id N) whose post-processor adds BOS."""
    from tokenizers import AddedToken, models, pre_tokenizers, processors
    from tokenizers import Tokenizer as Backend

    vocab = {f"w{i}": i for i in range(VOCAB - len(SPECIALS))}
    tok = Backend(models.WordLevel(vocab=vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(s, special=True) for s in SPECIALS])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS)]
    )
    tok.save(str(folder / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "w1", "chat_template": TEMPLATE}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def bos_model(tmp_path_factory) -> Path:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        eos_token_id=1, bos_token_id=BOS, tie_word_embeddings=True,
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("tiny-bos")
    transformers.LlamaForCausalLM(config).eval().save_pretrained(folder)
    write_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def bos_server(bos_model):
    s = start_server([str(bos_model), "--backend", "cpu", "--max-total-tokens", "4096"], fake=False)
    yield s
    assert s.stop() == 0, s.log()[-3000:]


def post(server, path: str, body: dict) -> dict:
    r = httpx.post(server.url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def complete(server, **body: object) -> dict:
    return post(server, "/v1/completions", {"max_tokens": 1, "temperature": 0, **body})


def test_tokenize_adds_bos_by_the_rule_and_never_twice(bos_server):
    def ids(**body: object) -> list[int]:
        return post(bos_server, "/tokenize", body)["tokens"]

    assert ids(content="w5 w6") == [5, 6]  # llama-server's default: no special tokens
    assert ids(content="w5 w6", add_special=True) == [BOS, 5, 6]
    assert ids(prompt="w5 w6") == [BOS, 5, 6]  # vLLM's default: add them
    assert ids(prompt="w5 w6", add_special_tokens=False) == [5, 6]
    assert ids(prompt="<s> w5 w6") == [BOS, 5, 6]  # the text's own BOS is the one
    assert ids(messages=USER) == [BOS, 5, 6]  # the template writes BOS: no second one
    pieces = post(bos_server, "/tokenize", {"prompt": "w5", "with_pieces": True})["tokens"]
    assert pieces == [{"id": BOS, "piece": "<s>"}, {"id": 5, "piece": "w5"}]


def test_completions_start_with_one_bos_and_echo_the_text_as_sent(bos_server):
    out = complete(bos_server, prompt="w5 w6", echo=True)
    assert out["usage"]["prompt_tokens"] == 3  # BOS w5 w6
    assert out["choices"][0]["text"].startswith("w5 w6")  # not "<s>"
    assert complete(bos_server, prompt="<s> w5 w6")["usage"]["prompt_tokens"] == 3
    assert complete(bos_server, prompt=["w5", "w6 w7"])["usage"]["prompt_tokens"] == 2 + 3


def test_token_id_prompts_are_left_as_given(bos_server):
    assert complete(bos_server, prompt=[5, 6])["usage"]["prompt_tokens"] == 2
    assert complete(bos_server, prompt=[[5, 6], [BOS, BOS, 7]])["usage"]["prompt_tokens"] == 5


def test_every_chat_dialect_counts_the_templates_single_bos(bos_server):
    counted = len(post(bos_server, "/tokenize", {"messages": USER})["tokens"])
    assert counted == 3
    chat = post(bos_server, "/v1/chat/completions", {"messages": USER, "max_tokens": 1})
    assert chat["usage"]["prompt_tokens"] == counted
    responses = post(bos_server, "/v1/responses", {"input": "w5 w6", "max_output_tokens": 1})
    assert responses["usage"]["input_tokens"] == counted
    model = httpx.get(bos_server.base + "/models").json()["data"][0]["id"]
    ollama = {"model": model, "stream": False, "options": {"num_predict": 1}}
    # Ollama counts the prompt tokens it evaluated (the cache holds these by now: at most 3);
    # generate's `context` is the whole prompt's ids (BOS w5 w6), then the output's.
    assert post(bos_server, "/api/chat", {**ollama, "messages": USER})["prompt_eval_count"] <= 3
    generated = post(bos_server, "/api/generate", {**ollama, "prompt": "w5 w6"})
    assert len(generated["context"]) - generated["eval_count"] == 3
    raw = {**ollama, "prompt": "w5 w6", "raw": True}
    assert 1 <= post(bos_server, "/api/generate", raw)["prompt_eval_count"] <= 3
    anthropic = {"model": model, "messages": USER}
    assert post(bos_server, "/v1/messages/count_tokens", anthropic)["input_tokens"] == 3


def test_anthropic_cache_control_pins_count_the_bos(bos_server):
    """A breakpoint's prefix is measured with the same BOS as the prompt, so it pins."""
    system = [{"type": "text", "text": "w8 w9", "cache_control": {"type": "ephemeral"}}]
    model = httpx.get(bos_server.base + "/models").json()["data"][0]["id"]
    body = {"model": model, "system": system, "messages": USER, "max_tokens": 1}
    usage = post(bos_server, "/v1/messages", body)["usage"]
    prompt = usage["input_tokens"] + usage["cache_read_input_tokens"]
    assert prompt + usage["cache_creation_input_tokens"] == 5  # BOS w8 w9 w5 w6
    assert usage["cache_creation_input_tokens"] + usage["cache_read_input_tokens"] >= 3


def test_fill_in_the_middle_prompts_start_with_bos(bos_server):
    """BOS PRE w5 w6 SUF w7 MID, on each FIM route."""
    assert complete(bos_server, prompt="w5 w6", suffix="w7")["usage"]["prompt_tokens"] == 7
    infill = {"input_prefix": "w5 w6", "input_suffix": "w7", "n_predict": 1}
    assert post(bos_server, "/infill", infill)["tokens_evaluated"] == 7
    model = httpx.get(bos_server.base + "/models").json()["data"][0]["id"]
    body = {"model": model, "prompt": "w5 w6", "suffix": "w7", "stream": False}
    body["options"] = {"num_predict": 1}
    generated = post(bos_server, "/api/generate", body)
    assert len(generated["context"]) - generated["eval_count"] == 7  # prompt ids, output ids


def test_the_in_process_engine_adds_bos_as_the_server_does(bos_model):
    from localradix import Engine
    from localradix.sampling_params import SamplingParams

    one = SamplingParams(max_new_tokens=1, temperature=0)
    with Engine(model=str(bos_model), backend="cpu", max_total_tokens=4096) as engine:
        assert engine.generate("w5 w6", one)[0].prompt_tokens == 3
        assert engine.generate([[5, 6]], one)[0].prompt_tokens == 2  # ids: as given
        assert engine.chat_ids(USER) == [BOS, 5, 6]
        assert engine.chat(USER, one).prompt_tokens == 3
