"""llama.cpp's own tokenizer vectors (models/ggml-vocab-*.gguf with .inp/.out, from the installed
llama-cpp-python's sdist) through LlamaVocabTokenizer: every input gives exactly the expected ids,
as test-tokenizer-0 checks (add_special and parse_special off), and decoding the ids gives the
text back the way llama-server streams it (joined pieces)."""

from __future__ import annotations

from pathlib import Path

import pytest
from llama_sdist import llama_cpp_tree, llama_version

from localradix.gguf_file import read_gguf

pytestmark = pytest.mark.slow  # seconds of e2e work: the full suite runs it, the fast tier does not

if llama_version() is None:
    pytest.skip("llama-cpp-python is not installed", allow_module_level=True)

SEPARATOR = "\n__ggml_vocab_test__\n"
VOCABS = sorted(
    p
    for p in (llama_cpp_tree() / "models").glob("ggml-vocab-*.gguf")
    if p.with_name(p.name + ".inp").is_file() and p.with_name(p.name + ".out").is_file()
)


def read_vectors(gguf: Path) -> dict[str, list[int]]:
    """test-tokenizer-0's read_tests: inputs split on the separator (a trailing one ends the
    last input), one `.out` line of ids per input (empty = no tokens); a repeated input keeps
    its last ids, as its std::map does. Read as bytes: the inputs hold "\\r"."""
    raw = gguf.with_name(gguf.name + ".inp").read_bytes().decode("utf-8")
    inputs = raw.split(SEPARATOR)
    if raw.endswith(SEPARATOR):
        inputs.pop()
    out = gguf.with_name(gguf.name + ".out").read_bytes().decode("utf-8")
    lines = out.split("\n")
    if out.endswith("\n"):
        lines.pop()
    assert len(inputs) == len(lines), f"{gguf.name}: {len(inputs)} inputs, {len(lines)} outputs"
    return {text: [int(t) for t in line.split()] for text, line in zip(inputs, lines, strict=True)}


def decoded_text(meta: dict, text: str) -> str:
    """What joined pieces give back: the text; a SentencePiece vocabulary with a space prefix
    also gives the space it prepended to a non-empty text (llama_detokenize would strip it;
    llama-server does not)."""
    spm = meta["tokenizer.ggml.model"] == "llama"
    prefix = spm and meta.get("tokenizer.ggml.add_space_prefix", True) and text != ""
    return " " + text if prefix else text


def test_the_vectors_are_there() -> None:
    names = {p.name for p in VOCABS}
    assert {"ggml-vocab-llama-spm.gguf", "ggml-vocab-qwen35.gguf", "ggml-vocab-gpt-2.gguf"} <= names


@pytest.mark.parametrize("gguf", VOCABS, ids=lambda p: p.name.removeprefix("ggml-vocab-"))
def test_vocab_vectors(gguf: Path) -> None:
    from localradix.loader.llama_vocab import LlamaVocabTokenizer

    tok = LlamaVocabTokenizer(gguf)
    meta = read_gguf(gguf, tensors=False).metadata
    try:
        for text, ids in read_vectors(gguf).items():
            assert tok.tokenize(text, add_special=False, parse_special=False) == ids, text
            decoded = tok.decode(ids, skip_special_tokens=False)
            if meta["tokenizer.ggml.model"] == "bert":
                # WordPiece normalizes (lower case, no accents, [UNK]): no text comes back,
                # but what does comes back is stable (test-tokenizer-1's check).
                assert tok.tokenize(decoded, add_special=False, parse_special=True) == ids, text
            else:
                assert decoded == decoded_text(meta, text), text
    finally:
        tok.close()
