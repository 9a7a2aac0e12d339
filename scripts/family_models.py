"""Random-weight models of each family the torch backend serves, for scripts/family_table.py.

The configs follow the tiny ones the tests use (tests/families/family_configs.py, and
tests/models/test_qwen3_5.py for Qwen3-Next), with the shapes taken from a `Scale`: "tiny"
(hidden 64, seconds to build and run) or "100m" (hidden 768, 10 layers, a 32k vocabulary:
about 100M parameters; the table says each model's real count). Each model is saved with a
word-level tokenizer (`w0` .. `w<vocab-1>`, EOS `w1`), as tests/engine/conftest.py does; for
llama.cpp, a twin with a tokenizer its converter knows is converted to an f32 GGUF.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any


@dataclass(frozen=True)
class Scale:
    vocab: int
    hidden: int
    layers: int  # a multiple of 2 (gpt-oss alternates); hybrids repeat 3 linear + 1 full
    heads: int
    kv_heads: int
    head_dim: int
    inter: int  # dense MLP width
    experts: int
    moe_inter: int  # each expert's width
    window: int  # sliding-window layers' window: shorter than the prefill prompt

    @property
    def init_std(self) -> float:
        """The tests' 0.2 at hidden 64, scaled so logits spread alike at any width (greedy
        ties, which float noise could flip between implementations, stay rare)."""
        return 0.2 * (64 / self.hidden) ** 0.5


SCALES = {
    "tiny": Scale(512, 64, 4, 4, 2, 16, 128, 4, 32, 64),
    "100m": Scale(32000, 768, 10, 12, 4, 64, 2048, 8, 256, 256),
}


def _attn(s: Scale, **kw: Any) -> dict[str, Any]:
    """The shape every family shares, with the word-level tokenizer's special ids."""
    base = dict(
        vocab_size=s.vocab,
        hidden_size=s.hidden,
        intermediate_size=s.inter,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        num_key_value_heads=s.kv_heads,
        head_dim=s.head_dim,
        max_position_embeddings=8192,
        initializer_range=s.init_std,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    return {**base, **kw}


def _moe(s: Scale) -> dict[str, Any]:
    """Qwen's experts: top-2, weights renormalised as the released models do."""
    return dict(num_experts_per_tok=2, moe_intermediate_size=s.moe_inter, norm_topk_prob=True)


def _linear_attn(s: Scale) -> dict[str, Any]:
    """Qwen3.5 / Qwen3-Next: gated delta-net layers, 3 of every 4, beside full attention."""
    return dict(
        layer_types=(["linear_attention"] * 3 + ["full_attention"]) * (s.layers // 4)
        + ["linear_attention"] * (s.layers % 4),
        linear_num_key_heads=s.heads // 2,
        linear_num_value_heads=s.heads,
        linear_key_head_dim=s.head_dim,
        linear_value_head_dim=s.head_dim,
    )


def _mrope(s: Scale) -> dict[str, Any]:
    """Qwen3.5's MRoPE, its sections filling the rotary half-dims as the released [11, 11, 10]
    do (llama.cpp asserts they fit; the converter's default is for head_dim 256)."""
    factor = 0.5 if s.head_dim < 32 else 0.25
    half = int(s.head_dim * factor) // 2
    sections = [half - 2 * (half // 3), half // 3, half // 3]
    return dict(
        rope_type="default",
        rope_theta=10000.0,
        partial_rotary_factor=factor,
        mrope_section=sections,
        mrope_interleaved=True,
    )


def _config(family: str, s: Scale) -> Any:
    import transformers as t

    swa = ["sliding_attention", "full_attention"] * (s.layers // 2)
    if family == "llama":
        return t.LlamaConfig(**_attn(s))
    if family == "qwen3":
        return t.Qwen3Config(**_attn(s))
    if family == "phi3":  # Phi3Config derives head_dim from hidden / heads
        return t.Phi3Config(**{k: v for k, v in _attn(s).items() if k != "head_dim"})
    if family == "smollm3":
        return t.SmolLM3Config(**_attn(s), no_rope_layer_interval=4)
    if family == "mixtral":
        return t.MixtralConfig(
            **_attn(s, intermediate_size=s.moe_inter), num_local_experts=s.experts
        )
    if family == "qwen3_moe":
        return t.Qwen3MoeConfig(**_attn(s), **_moe(s), num_experts=s.experts)
    if family == "gemma3":  # Gemma 3's own pattern, 5 sliding layers then 1 full (the only
        # one llama.cpp knows: its converter writes none), so at least 6 layers
        layers = max(s.layers, 6)
        pattern = ["full_attention" if i % 6 == 5 else "sliding_attention" for i in range(layers)]
        return t.Gemma3TextConfig(
            **_attn(s, num_hidden_layers=layers),
            layer_types=pattern,
            sliding_window=s.window,
            query_pre_attn_scalar=s.head_dim,
        )
    if family == "gemma4":
        full = [i for i, kind in enumerate(swa) if kind == "full_attention"]
        # full-attention layers get wider heads, as Gemma 4's own config gives them
        wide: dict[str, Any] = {
            "per_layer_config": {f"{i:02d}": {"head_dim": 2 * s.head_dim} for i in full}
        }
        return t.Gemma4TextConfig(
            **_attn(s),
            vocab_size_per_layer_input=s.vocab,
            hidden_size_per_layer_input=16 if s.hidden <= 64 else 32,
            layer_types=swa,
            sliding_window=s.window,
            **wide,
        )
    if family == "gpt_oss":
        return t.GptOssConfig(
            # YaRN's own ratio (32 x its 4096 original positions): no mismatch warning
            **_attn(s, intermediate_size=s.moe_inter, max_position_embeddings=131072),
            num_local_experts=s.experts,
            num_experts_per_tok=2,
            layer_types=swa,
            sliding_window=s.window,
        )
    if family == "qwen3_5":
        return t.Qwen3_5TextConfig(
            **_attn(s), **_linear_attn(s), rope_parameters=_mrope(s), tie_word_embeddings=True
        )
    if family == "qwen3_next":  # experts in every layer (as released; llama.cpp's converter
        # maps no dense MLP), a shared expert beside them
        return t.Qwen3NextConfig(
            **_attn(s),
            **_linear_attn(s),
            **_moe(s),
            num_experts=s.experts,
            shared_expert_intermediate_size=s.moe_inter,
        )
    raise ValueError(f"unknown family {family!r}")


def _gemma_weights(model: Any) -> None:
    """As tests/families/family_configs.py: Gemma ties its output to a sqrt(hidden)-scaled input
    embedding, so with plain init the model repeats its last token. A small embedding and a
    final norm scaling by 10 keep logits spread but let the context decide."""
    import torch

    with torch.no_grad():
        model.get_input_embeddings().weight.normal_(0.0, 0.05)
        norm = model.model.norm.weight
        # Gemma 3's norm multiplies by 1 + w (initialized 0), Gemma 4's by w (initialized 1).
        norm.fill_(9.0 if float(norm.mean()) == 0.0 else 10.0)


TUNE: dict[str, Callable[[Any], None]] = {"gemma3": _gemma_weights, "gemma4": _gemma_weights}
# llama.cpp's converter: the tokenizer kind it needs (others: "bpe") and its extra flags
GGUF_TOKENIZER = {"gemma3": "spm-gemma", "gemma4": "spm-gemma", "phi3": "spm-llama"}
GGUF_FLAGS = {
    "qwen3_5": ("--no-mtp",),
    "qwen3_next": ("--no-mtp",),
    "phi3": ("--model-name", "tiny-phi3"),
}
FAMILIES = [
    "llama", "qwen3", "phi3", "smollm3", "mixtral", "qwen3_moe",
    "gemma3", "gemma4", "gpt_oss", "qwen3_5", "qwen3_next",
]  # fmt: skip


def build(family: str, scale: str, folder: Path) -> tuple[Any, int]:
    """Save a random `family` model at `scale` with a word-level tokenizer in `folder`:
    (the transformers model in fp32 eval mode, its parameter count)."""
    s = SCALES[scale]
    model = _save(_config(family, s), family, folder)
    write_tokenizer(folder, s.vocab)
    return model, sum(p.numel() for p in model.parameters())


def build_gguf(family: str, scale: str, folder: Path) -> tuple[Any, int, Path]:
    """The same model for llama.cpp: a tokenizer its converter knows (tests/families/
    gguf_families.py's: SmolLM2's BPE, 49,152 ids; a 1,024-id SentencePiece for Gemma and
    Phi-3), hence its own vocabulary size, converted to an f32 GGUF (`folder`/model.gguf)."""
    from tests.families import gguf_families

    kind = SimpleNamespace(vocab=GGUF_TOKENIZER.get(family, "bpe"))
    config = _config(family, replace(SCALES[scale], vocab=gguf_families._vocab_size(kind)))
    config.bos_token_id, config.eos_token_id = (2, 1) if kind.vocab == "spm-gemma" else (1, 2)
    model = _save(config, family, folder)
    gguf_families._write_tokenizer(kind, folder)
    _convert(folder, folder / "model.gguf", GGUF_FLAGS.get(family, ()))
    return model, sum(p.numel() for p in model.parameters()), folder / "model.gguf"


def _save(config: Any, family: str, folder: Path, seed: int = 0) -> Any:
    """A seeded random model of `config` (tuned where the family needs it), saved; fp32, eval."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # stderr is the table's progress log
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    if family in TUNE:
        TUNE[family](model)
    model.save_pretrained(folder)
    return model


def _convert(folder: Path, out: Path, flags: tuple[str, ...]) -> None:
    """llama.cpp's converter from the installed llama-cpp-python's sdist, its own gguf-py
    first on the path (as tests/families/gguf_families.py runs it), to f32."""
    from tests.llama_sdist import llama_cpp_tree

    tree = llama_cpp_tree()
    path = [str(tree / "gguf-py"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    cmd = [sys.executable, str(tree / "convert_hf_to_gguf.py"), str(folder), "--outfile"]
    done = subprocess.run(
        [*cmd, str(out), "--outtype", "f32", *flags], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:  # the error is its last line (after the log and traceback)
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "")


def write_tokenizer(folder: Path, vocab: int) -> None:
    """A word-level tokenizer over `vocab` ids (tests/engine/conftest.py's, any size)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "w1"}))
