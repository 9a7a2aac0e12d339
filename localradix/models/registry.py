"""HF `architectures` names -> model classes, imported lazily (no torch until one is built)."""

from __future__ import annotations

from typing import Any

from localradix.registry import Registry, UnknownName

_DECODER = "localradix.models.decoder:DecoderForCausalLM"

MODEL_REGISTRY: Registry[Any] = Registry(
    "model architecture",
    {
        "LlamaForCausalLM": _DECODER,
        "MistralForCausalLM": _DECODER,
        "Qwen2ForCausalLM": _DECODER,
        "Qwen3ForCausalLM": _DECODER,
        "Phi3ForCausalLM": _DECODER,  # Phi-3 and Phi-4(-mini): fused weights, longrope
        "SmolLM3ForCausalLM": _DECODER,  # some layers without RoPE
        "MixtralForCausalLM": _DECODER,  # mixture of experts (models/moe.py)
        "Qwen3MoeForCausalLM": _DECODER,  # ... with q/k norm, some layers maybe dense
        # Gemma 3 text: (1 + w) norms, four a layer, GeGLU, sliding-window layers
        "Gemma3ForCausalLM": "localradix.models.gemma3:Gemma3ForCausalLM",
        # Gemma 4 text: per-layer head sizes, shared KV, per-layer inputs, optional experts
        "Gemma4ForCausalLM": "localradix.models.gemma4:Gemma4ForCausalLM",
        "Gemma4ForConditionalGeneration": "localradix.models.gemma4:Gemma4ForCausalLM",
        # gpt-oss: attention sinks, sliding-window layers, YaRN, biased clamped-SwiGLU experts
        "GptOssForCausalLM": "localradix.models.gpt_oss:GptOssForCausalLM",
        # Qwen3.5: gated delta-net linear attention beside gated full attention
        "Qwen3_5ForCausalLM": "localradix.models.qwen3_5:Qwen3_5ForCausalLM",
        "Qwen3_5MoeForCausalLM": "localradix.models.qwen3_5:Qwen3_5ForCausalLM",  # + experts
        "Qwen3NextForCausalLM": "localradix.models.qwen3_5:Qwen3_5ForCausalLM",  # its layout
        # ... the text model of multimodal Qwen3.5 checkpoints (the vision tower is skipped)
        "Qwen3_5ForConditionalGeneration": "localradix.models.qwen3_5:Qwen3_5ForCausalLM",
        "Qwen3_5MoeForConditionalGeneration": "localradix.models.qwen3_5:Qwen3_5ForCausalLM",
        # Bare decoders (embedding models such as Qwen3-Embedding): the same stack, no head.
        "LlamaModel": _DECODER,
        "MistralModel": _DECODER,
        "Qwen2Model": _DECODER,
        "Qwen3Model": _DECODER,
    },
)


def get_model_class(architecture: str) -> Any:
    """The class implementing `architecture` (an HF `architectures` entry)."""
    if architecture not in MODEL_REGISTRY:
        known = ", ".join(sorted(MODEL_REGISTRY))
        raise UnknownName(
            f"the torch backend does not implement {architecture!r} (it runs {known}): convert "
            "the model to GGUF (llama.cpp's convert_hf_to_gguf.py) and serve it with "
            "--backend llamacpp"
        )
    return MODEL_REGISTRY.load(architecture)


def is_supported(architecture: str) -> bool:
    return architecture in MODEL_REGISTRY
