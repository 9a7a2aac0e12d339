"""Model loading: Hugging Face folders, GGUF conversion, tokenizers, chat templates (where a
model comes from, `resolve_model` and `ModelSource`, is the store's: re-exported here).

`resolve_model`, `load_tokenizer` and `load_model_config` import no torch (the API process uses
them); `load_model` and `resolve_dtype` import it on first use.
"""

from __future__ import annotations

from typing import Any

from localradix.loader.tokenizer import Tokenizer
from localradix.loader.tokenizer_choice import load_tokenizer
from localradix.store.source import ModelSource, ModelSourceError, resolve_model

_LAZY = {
    "load_model": "localradix.loader.model_loader",
    "load_model_config": "localradix.loader.model_loader",
    "resolve_dtype": "localradix.loader.dtype",
}

__all__ = [
    "ModelSource",
    "ModelSourceError",
    "Tokenizer",
    "load_model",
    "load_model_config",
    "load_tokenizer",
    "resolve_dtype",
    "resolve_model",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
