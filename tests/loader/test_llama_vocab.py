"""LlamaVocabTokenizer (a GGUF tokenized by llama.cpp itself) and load_tokenizer's choice between
it and the rebuilt `tokenizers` one, which is kept only where it is exact."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from llama_sdist import llama_cpp_tree, llama_version

from localradix.gguf_file import read_gguf
from localradix.loader import tokenizer_choice as tokenizer_module
from localradix.loader.gguf_tokenizer import (
    EXACT_REBUILDS,
    build_gguf_tokenizer,
    require_exact_rebuild,
)
from localradix.loader.tokenizer import Tokenizer
from localradix.loader.tokenizer_choice import load_tokenizer
from localradix.store.bundled import find_bundled
from localradix.store.source import ModelSourceError

from .test_vocab_vectors import VOCABS, read_vectors

if llama_version() is None:
    pytest.skip("llama-cpp-python is not installed", allow_module_level=True)

from localradix.loader.llama_vocab import LlamaVocabTokenizer  # noqa: E402

BUNDLED = find_bundled()
MODELS = llama_cpp_tree() / "models"  # resolved once: tests below may move the cache folder
PARTS = [
    "Hello", " world", "don't", "I'LL", "we've", " 's", "123", "4567890", " 2024", "3.14", "½",
    "①", "٣", "\n", "\n\n", "\r\n", "\t", "  ", "   ", " \n ", "\u00a0", "\u3000", "é", "e\u0301",
    "ﬁ", "Ｈｅｌｌｏ", "日本語", "我想在apple工作", "Привет", "مرحبا", "हिन्दी", "កាន់", "🦙",
    "😶\u200d🌫️", "👍🏽", "...", "?!", "def f(x):", "    return x ** 2", '{"a": [1, 2]}', "</s>",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<reponame>", "CamelCase", "\\", "\u200b", "\x00",
]  # fmt: skip


def vocab(name: str) -> Path:
    return MODELS / f"ggml-vocab-{name}.gguf"


def varied_strings(n: int = 300, seed: int = 0) -> list[str]:
    """Every vector input of every vocabulary, plus seeded random mixes of tricky parts."""
    texts = {text: None for gguf in VOCABS for text in read_vectors(gguf)}
    rng = random.Random(seed)
    for _ in range(n):
        sep = rng.choice(["", " ", "  ", "\n"])
        texts[sep.join(rng.choices(PARTS, k=rng.randint(1, 8)))] = None
    return list(texts)


@pytest.fixture(scope="module")
def smol() -> LlamaVocabTokenizer:
    if BUNDLED is None:
        pytest.skip("the bundled SmolLM2 is not installed")
    return LlamaVocabTokenizer(BUNDLED)


@pytest.fixture(scope="module")
def reference(smol: LlamaVocabTokenizer):
    """llama-cpp-python's own high-level class on the same file: an independent caller."""
    from llama_cpp import Llama

    return Llama(str(BUNDLED), vocab_only=True, verbose=False)


@pytest.fixture
def without_llama_cpp(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only the "is llama_cpp importable" check is patched: load_tokenizer then takes the path of
    # a torch-only install (the rebuilt tokenizer, or a refusal) on the real files.
    monkeypatch.setattr(tokenizer_module, "llama_cpp_installed", lambda: False)


def test_load_tokenizer_uses_llama_cpp_for_gguf(smol: LlamaVocabTokenizer) -> None:
    assert isinstance(load_tokenizer(str(BUNDLED)), LlamaVocabTokenizer)


def test_bundled_encode_decode_agree_with_llama_cpp(smol: LlamaVocabTokenizer, reference) -> None:
    for text in varied_strings(100):
        ids = smol.encode(text)
        assert ids == reference.tokenize(text.encode(), add_bos=False, special=True), text
        for special in (True, False):
            pieces = b"".join(reference.detokenize([i], special=special) for i in ids)
            decoded = smol.decode(ids, skip_special_tokens=not special)
            assert decoded == pieces.decode("utf-8", "replace"), text
        assert smol.decode(ids, skip_special_tokens=False) == text  # byte-level: lossless


def test_bundled_specials_and_template(smol: LlamaVocabTokenizer, reference) -> None:
    meta = read_gguf(BUNDLED, tensors=False).metadata
    tokens = meta["tokenizer.ggml.tokens"]
    assert smol.vocab_size == len(tokens) == reference.n_vocab() == 49152
    assert smol.bos_token_id == meta["tokenizer.ggml.bos_token_id"] == reference.token_bos()
    assert smol.eos_token_id == meta["tokenizer.ggml.eos_token_id"] == reference.token_eos()
    assert smol.eos_token_ids[0] == 2 and set(smol.eos_token_ids) >= {2, 0}  # <|endoftext|> too
    assert smol.special_tokens["bos_token"] == tokens[smol.bos_token_id] == "<|im_start|>"
    assert smol.special_tokens["eos_token"] == "<|im_end|>"
    assert smol.chat_template == meta["tokenizer.chat_template"]
    messages = [{"role": "user", "content": "hi"}]
    prompt = smol.apply_chat_template(messages)
    assert prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    ids = smol.encode(prompt)
    assert ids.count(smol.bos_token_id) == 3 and smol.eos_token_id in ids  # specials, not text
    assert smol.token_to_id("<|im_start|>") == 1 and smol.token_to_id("hello world") is None


def test_pieces_are_raw_bytes(smol: LlamaVocabTokenizer) -> None:
    ids = smol.encode("🦙")
    assert len(ids) == 3 and smol.decode(ids[:1]) == "\ufffd"  # a split character: U+FFFD
    assert b"".join(smol.piece_bytes(i) for i in ids) == "🦙".encode()
    # xgrammar's vocabulary: the end of generation (<|im_end|>) is b"", control tokens keep
    # their text (<|im_start|>) so a grammar can match them as the model writes them.
    pieces = smol.convert_ids_to_tokens([1, 2, *ids])
    assert pieces == [b"<|im_start|>", b"", *map(smol.piece_bytes, ids)]
    assert smol.decode([smol.vocab_size, -1]) == ""  # ids outside the vocabulary: nothing


def test_pieces_longer_than_32_bytes() -> None:
    """llama-cpp-python's Llama.detokenize drops these; llama-server does not."""
    tok = LlamaVocabTokenizer(vocab("qwen35"))
    text = " " * 100 + "x" + "-" * 64
    ids = tok.encode(text)
    assert max(len(tok.piece_bytes(i)) for i in ids) > 32 and tok.decode(ids) == text


def test_grammar_sees_a_raw_vocabulary(smol: LlamaVocabTokenizer) -> None:
    import numpy as np
    import xgrammar as xgr

    from localradix.constrained.grammar import GrammarService, bitmask_width
    from localradix.sampling_params import Constraint

    service = GrammarService(smol, smol.vocab_size)
    assert service._metadata()["vocab_type"] == xgr.VocabType.RAW.value
    state = service.new_state(service.submit(Constraint("regex", " [a-z]+")).result(timeout=60))
    mask = np.zeros((1, bitmask_width(smol.vocab_size)), dtype=np.int32)
    state.fill_mask(mask, 0)
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[: smol.vocab_size]
    allowed = {smol.piece_bytes(i) for i in np.flatnonzero(bits)}
    assert b" hello" in allowed and b" " in allowed and b"hello" not in allowed
    assert all(p[:1] == b" " and p[1:].isalpha() for p in allowed if len(p) > 1)


def test_encode_is_thread_safe(smol: LlamaVocabTokenizer) -> None:
    texts = varied_strings(200, seed=1) * 4
    serial = [smol.encode(t) for t in texts]
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(smol.encode, texts)) == serial


@pytest.mark.parametrize("name", ["llama-spm", "llama-bpe"])
def test_encode_prompt_adds_one_bos_where_the_vocab_does(name: str) -> None:
    tok = LlamaVocabTokenizer(vocab(name))
    bos = tok.bos_token_id
    assert tok.add_bos and bos is not None
    body = tok.encode("Hello world")
    assert tok.encode_prompt("Hello world") == [bos, *body]
    assert tok.encode_prompt(tok.special_tokens["bos_token"] + "Hello world") == [bos, *body]
    doubled = tok.encode(tok.special_tokens["bos_token"] + "Hi", add_special_tokens=True)
    assert doubled[:2] == [bos, bos]  # what llama.cpp's own rule alone gives


def test_encode_prompt_adds_no_bos_where_the_vocab_does_not() -> None:
    tok = LlamaVocabTokenizer(vocab("qwen35"))
    assert not tok.add_bos
    assert tok.encode_prompt("Hello world") == tok.encode("Hello world")
    with_bos = tok.special_tokens["bos_token"] + "Hello world"
    assert tok.encode_prompt(with_bos) == tok.encode(with_bos)  # the text's own BOS stays


def test_qwen35_blank_line_is_one_token() -> None:
    """llama.cpp keeps "\\n\\n" one piece under qwen35's pre-tokenizer; the rebuild, which does
    not know that pre-tokenizer, split it in two (and is refused for it now)."""
    tok = LlamaVocabTokenizer(vocab("qwen35"))
    assert tok.encode("a\n\nb") == [64, 271, 65] and tok.decode([271]) == "\n\n"
    rebuilt, _ = build_gguf_tokenizer(read_gguf(vocab("qwen35"), tensors=False).metadata)
    assert rebuilt.encode("a\n\nb").ids == [64, 198, 198, 65]


def test_rebuilt_tokenizer_refuses_an_inexact_pre_tokenizer(without_llama_cpp: None) -> None:
    with pytest.raises(ModelSourceError) as refused:
        load_tokenizer(str(vocab("qwen35")))
    assert str(refused.value) == (
        "GGUF tokenizer 'gpt2' with pre-tokenizer 'qwen35' is not reproduced exactly without "
        "llama.cpp: pip install llama-cpp-python"
    )
    with pytest.raises(ModelSourceError, match="'llama' with pre-tokenizer 'default'"):
        load_tokenizer(str(vocab("llama-spm")))


def test_allowed_rebuilds_match_the_vectors() -> None:
    """Every allowed (model, pre) pair was measured: the vectors of its vocabulary, or (smollm,
    which has none) the bundled model below. The rebuild is built directly: load_tokenizer would
    also derive a torch config, which these vocabulary-only files' architectures lack."""
    covered = set()
    for gguf in VOCABS:
        meta = read_gguf(gguf, tensors=False).metadata
        pair = (meta["tokenizer.ggml.model"], meta.get("tokenizer.ggml.pre", "default"))
        if pair in EXACT_REBUILDS:
            require_exact_rebuild(meta)
            rebuilt, _ = build_gguf_tokenizer(meta)
            for text, ids in read_vectors(gguf).items():
                assert rebuilt.encode(text, add_special_tokens=False).ids == ids, (gguf.name, text)
            covered.add(pair)
    covered.add(("gpt2", "smollm"))  # test_bundled_smollm_rebuild_is_exact
    assert covered == EXACT_REBUILDS, "an allowed pair with no measurement"


def test_bundled_smollm_rebuild_is_exact(without_llama_cpp: None, cache_dir: Path, smol) -> None:
    rebuilt = load_tokenizer(str(BUNDLED))
    assert isinstance(rebuilt, Tokenizer)
    for text in varied_strings(500, seed=2):
        ids = smol.encode(text)
        assert rebuilt.encode(text) == ids, text
        assert rebuilt.decode(ids, skip_special_tokens=False) == smol.decode(ids, False), text


def test_close_frees_the_model() -> None:
    tok = LlamaVocabTokenizer(vocab("gpt-2"))
    tok.close()
    tok.close()  # twice is fine
    with pytest.raises(ValueError, match="closed"):
        tok.encode("hello")  # an error, not a read of freed memory
