"""Which tokenizer a model gets: `load_tokenizer(source)` loads only that (no weights, no torch),
for the API process.

A Hugging Face folder is read with `tokenizers`. A GGUF is tokenized by llama.cpp's own
vocabulary code (`llama_vocab.py`) when llama-cpp-python is installed: that is the only exact
one. Without it, a GGUF's tokenizer is rebuilt from its metadata (see `gguf_convert.py`), but
only for the kinds it reproduces exactly (`gguf_tokenizer.EXACT_REBUILDS`); any other is
refused by name.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from localradix.loader.llama_vocab import LlamaVocabTokenizer
from localradix.loader.tokenizer import ChatTokenizer, Tokenizer
from localradix.store.source import ModelSource, resolve_model


def load_tokenizer(source: ModelSource | str | None) -> ChatTokenizer:
    """Only the tokenizer of a model (fast; no weights, no torch)."""
    if not isinstance(source, ModelSource):
        source = resolve_model(source)
    if source.kind == "hf":
        return Tokenizer.from_folder(source.path)
    if llama_cpp_installed():
        return LlamaVocabTokenizer(source.path)
    return _rebuilt_gguf_tokenizer(source.path)


def llama_cpp_installed() -> bool:
    """Whether llama-cpp-python is installed (found without importing it: a broken install
    then fails loudly in LlamaVocabTokenizer rather than falling back to an inexact rebuild)."""
    return importlib.util.find_spec("llama_cpp") is not None


def _rebuilt_gguf_tokenizer(path: Path) -> Tokenizer:
    """A GGUF's tokenizer rebuilt for `tokenizers`, only where that is exact (else refused)."""
    from localradix.gguf_file import read_gguf
    from localradix.loader.gguf_convert import ensure_gguf_tokenizer
    from localradix.loader.gguf_tokenizer import require_exact_rebuild

    require_exact_rebuild(read_gguf(path, tensors=False).metadata)
    return Tokenizer.from_folder(ensure_gguf_tokenizer(path))
