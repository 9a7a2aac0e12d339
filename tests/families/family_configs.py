"""The tiny configs of every family: transformers config, tokenizer kind, converter flags and
the workarounds a tiny config needs (each with the reason), for gguf_families.py to build."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SEED = 0
HIDDEN = 64
SPM_VOCAB = 1024
# Larger than transformers' 0.02: logits spread by several units, so greedy ties (which float
# noise between batch layouts could flip) are rare, and every layer moves the residual stream,
# so the next token depends on the context and a wrong cached prefix shows.
INIT_STD = 0.2


@dataclass(frozen=True)
class Family:
    name: str
    kind: str  # "dense" | "swa" | "moe" | "hybrid" | "recurrent": what the tests expect of it
    config: Callable[[int], Any]  # vocab size -> transformers config
    vocab: str = "bpe"  # "bpe" (SmolLM2's) | "spm-gemma" | "spm-llama" (trained here)
    flags: tuple[str, ...] = ()  # extra converter flags
    fix_config: Callable[[dict[str, Any]], None] | None = None  # edits to the saved config.json
    tune: Callable[[Any], None] | None = None  # edits to the initialized weights
    note: str = ""  # the workarounds in a line (also written to the cache's build.json)


def _attn(**kw: Any) -> dict[str, Any]:
    """The attention shape every family shares: 4 query heads of 16, 2 KV heads."""
    base = dict(
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=16384,  # above the engines' context: no overflow warning
        initializer_range=INIT_STD,
    )
    return {**base, **kw}


def _llama(vocab: int) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab, num_hidden_layers=2, **_attn(), **_bpe_ids())


def _qwen3(vocab: int) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=vocab, num_hidden_layers=2, **_attn(), **_bpe_ids())


def _qwen3_moe(vocab: int) -> Any:
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=vocab,
        num_hidden_layers=2,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        **_attn(),
        **_bpe_ids(),
    )


def _qwen3_5(vocab: int) -> Any:
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(
        vocab_size=vocab,
        num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        tie_word_embeddings=True,
        # llama.cpp's Qwen3.5 needs MRoPE sections that fit the rotary dims (8 here); the
        # converter's default [11, 11, 10] is for head_dim 256 and fails a ggml assert.
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
        },
        **_attn(),
        **_bpe_ids(),
    )


def _gemma3(vocab: int) -> Any:
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(
        vocab_size=vocab,
        # The converter writes no layer pattern: llama.cpp assumes 5 sliding + 1 full per 6.
        num_hidden_layers=6,
        sliding_window=64,  # shorter than the tests' prompts, so the window matters
        query_pre_attn_scalar=16,
        **_attn(),
        **_spm_gemma_ids(),
    )


def _gemma_weights(model: Any) -> None:
    """Gemma ties the output to the input embedding and scales the input by sqrt(hidden): with
    plain init the token's own logit wins and the model repeats its last token. A small
    embedding and a final norm scaling by 10 keep logits spread but let the layers, i.e. the
    context, decide."""
    import torch

    with torch.no_grad():
        model.get_input_embeddings().weight.normal_(0.0, 0.05)
        norm = model.model.norm.weight
        # Gemma 3's norm multiplies by 1 + w (initialized 0), Gemma 4's by w (initialized 1).
        norm.fill_(9.0 if float(norm.mean()) == 0.0 else 10.0)


def _gemma4(vocab: int) -> Any:
    from transformers import Gemma4TextConfig

    return Gemma4TextConfig(
        vocab_size=vocab,
        vocab_size_per_layer_input=vocab,
        hidden_size_per_layer_input=16,
        num_hidden_layers=4,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        per_layer_config={"03": {"head_dim": 32}},
        sliding_window=64,
        **_attn(),
        **_spm_gemma_ids(),
    )


def _gpt_oss(vocab: int) -> Any:
    from transformers import GptOssConfig

    return GptOssConfig(
        vocab_size=vocab,
        num_hidden_layers=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=64,
        **_attn(intermediate_size=32),
        **_bpe_ids(),
    )


def _phi3(vocab: int) -> Any:
    from transformers import Phi3Config

    kw = _attn()
    kw.pop("head_dim")  # Phi3Config derives it from hidden_size / heads
    return Phi3Config(
        vocab_size=vocab,
        num_hidden_layers=2,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        **kw,
    )


def _mixtral(vocab: int) -> Any:
    from transformers import MixtralConfig

    return MixtralConfig(
        vocab_size=vocab,
        num_hidden_layers=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        **_attn(intermediate_size=32),
        **_bpe_ids(),
    )


def _granite_hybrid(vocab: int) -> Any:
    from transformers import GraniteMoeHybridConfig

    return GraniteMoeHybridConfig(
        vocab_size=vocab,
        num_hidden_layers=4,
        layer_types=["mamba", "mamba", "attention", "mamba"],
        num_local_experts=4,
        num_experts_per_tok=2,
        shared_intermediate_size=64,
        mamba_n_heads=8,
        mamba_d_head=16,
        mamba_n_groups=1,
        mamba_d_state=16,
        mamba_chunk_size=64,
        **_attn(intermediate_size=32),
        **_bpe_ids(),
    )


def _granite_layer_types(config: dict[str, Any]) -> None:
    # transformers 5 saves full_attention/linear_attention; the converter counts only "attention".
    names = {"full_attention": "attention", "linear_attention": "mamba"}
    config["layer_types"] = [names.get(t, t) for t in config["layer_types"]]


def _lfm2(vocab: int) -> Any:
    from transformers import Lfm2Config

    kw = _attn()
    kw.pop("head_dim")  # Lfm2Config derives it from hidden_size / heads
    return Lfm2Config(
        vocab_size=vocab,
        num_hidden_layers=4,
        full_attn_idxs=[1, 3],
        block_multiple_of=32,  # the default 256 would round the tiny FFN up to 256
        **kw,
        **_bpe_ids(),
    )


def _smollm3(vocab: int) -> Any:
    from transformers import SmolLM3Config

    return SmolLM3Config(
        vocab_size=vocab,
        num_hidden_layers=4,
        no_rope_layer_interval=4,
        **_attn(),
        **_bpe_ids(),
    )


def _mamba2(vocab: int) -> Any:
    from transformers import Mamba2Config

    return Mamba2Config(
        vocab_size=vocab,
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_heads=8,
        head_dim=16,
        n_groups=1,
        state_size=16,
        expand=2,
        chunk_size=64,
        initializer_range=INIT_STD,
        **_bpe_ids(),
    )


def _bpe_ids() -> dict[str, Any]:
    """SmolLM2's specials: <|endoftext|> 0, <|im_start|> 1, <|im_end|> 2."""
    return dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)


def _spm_gemma_ids() -> dict[str, Any]:
    return dict(pad_token_id=0, eos_token_id=1, bos_token_id=2)


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("llama", "dense", _llama),
        Family("qwen3", "dense", _qwen3),
        Family("qwen3_moe", "moe", _qwen3_moe),
        Family(
            "qwen3_5",
            "hybrid",
            _qwen3_5,
            flags=("--no-mtp",),
            note="--no-mtp: the config has no MTP layers",
        ),
        Family(
            "gemma3_text",
            "swa",
            _gemma3,
            vocab="spm-gemma",
            tune=_gemma_weights,
            note="6 layers (5 SWA + 1); small tied embedding",
        ),
        Family(
            "gemma4_text",
            "swa",
            _gemma4,
            vocab="spm-gemma",
            tune=_gemma_weights,
            note="SentencePiece-style tokenizer.json (its converter takes no other)",
        ),
        Family("gpt_oss", "swa", _gpt_oss),
        Family(
            "phi3",
            "dense",
            _phi3,
            vocab="spm-llama",
            flags=("--model-name", "tiny-phi3"),
            note="tokenizer.model; --model-name with 'phi3' (llama.cpp then finds </s>)",
        ),
        Family("mixtral", "moe", _mixtral, note="converts to arch llama with expert tensors"),
        Family(
            "granitemoehybrid",
            "hybrid",
            _granite_hybrid,
            fix_config=_granite_layer_types,
            note="layer_types rewritten to mamba/attention for the converter",
        ),
        Family("lfm2", "hybrid", _lfm2),
        Family("smollm3", "dense", _smollm3),
        Family("mamba2", "recurrent", _mamba2),
    )
}
