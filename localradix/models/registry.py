"""HF `architectures` names -> model classes, imported lazily (no torch until one is built)."""

from __future__ import annotations

import importlib
from typing import Any

_DECODER = "localradix.models.decoder:DecoderForCausalLM"

MODEL_REGISTRY: dict[str, str] = {
    "LlamaForCausalLM": _DECODER,
    "MistralForCausalLM": _DECODER,
    "Qwen2ForCausalLM": _DECODER,
    "Qwen3ForCausalLM": _DECODER,
}


def get_model_class(architecture: str) -> Any:
    """The class implementing `architecture` (an HF `architectures` entry)."""
    try:
        target = MODEL_REGISTRY[architecture]
    except KeyError:
        known = ", ".join(sorted(MODEL_REGISTRY))
        raise ValueError(
            f"model architecture {architecture!r} is not supported; supported: {known}"
        ) from None
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def is_supported(architecture: str) -> bool:
    return architecture in MODEL_REGISTRY
