"""A tiny random-weight Qwen3 embedding model saved as Qwen3-Embedding is: config naming the
bare `Qwen3Model`, safetensors without `lm_head`, a tokenizer that appends its EOS ("w1", id 1)
to every text, sentence-transformers pooling files. Shared by the engine and server tests."""

from __future__ import annotations

import json
from pathlib import Path

VOCAB = 512


def save_embedding_model(folder: Path, pooling: str = "last", normalize: bool = True) -> object:
    """Save the model to `folder` and return the transformers `Qwen3Model` (fp32, eval)."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        eos_token_id=1,
        tie_word_embeddings=False,
    )
    model = transformers.Qwen3Model(config).eval()
    model.save_pretrained(folder)
    tok = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # Qwen3-Embedding's tokenizer appends its EOS to every text: the token it pools.
    tok.post_processor = processors.TemplateProcessing(single="$A w1", special_tokens=[("w1", 1)])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "w1"}))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    if normalize:
        modules.append(
            {
                "idx": 2,
                "name": "2",
                "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize",
            }
        )
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": 64,
                "pooling_mode_cls_token": False,
                "pooling_mode_mean_tokens": pooling == "mean",
                "pooling_mode_lasttoken": pooling == "last",
            }
        )
    )
    return model


def reference_embedding(
    model: object, ids: list[int], pooling: str, normalize: bool
) -> list[float]:
    """transformers' vector: the last hidden state pooled as sentence-transformers does."""
    import torch

    with torch.no_grad():
        hidden = model(torch.tensor([ids])).last_hidden_state[0]  # type: ignore[operator]
    vec = hidden[-1] if pooling == "last" else hidden.mean(dim=0)
    if normalize:
        vec = torch.nn.functional.normalize(vec, dim=0)
    return vec.tolist()
