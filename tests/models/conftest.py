"""Tiny random-weight checkpoints saved by transformers, and a stepper over our attention backend."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

COMMON = dict(
    vocab_size=160,
    hidden_size=64,
    intermediate_size=112,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}


def _configs() -> dict[str, object]:
    t = transformers
    return {
        "llama": t.LlamaConfig(**COMMON, rope_theta=10000.0),
        "llama_tied": t.LlamaConfig(**COMMON, tie_word_embeddings=True),
        "llama3_rope": t.LlamaConfig(**COMMON, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE),
        "mistral": t.MistralConfig(**COMMON, sliding_window=None),
        "qwen2": t.Qwen2Config(**COMMON, tie_word_embeddings=True),
        "qwen3": t.Qwen3Config(**{**COMMON, "num_key_value_heads": 1}, head_dim=32),
    }


ARCHS = list(_configs())


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """name -> (saved folder, the transformers model in fp32 eval mode)."""
    out = {}
    for name, config in _configs().items():
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
        with torch.no_grad():  # random norm weights, so a wrong norm mapping shows
            for n, p in model.named_parameters():
                if "norm" in n:
                    p.copy_(1.0 + 0.1 * torch.randn_like(p))
        folder = tmp_path_factory.mktemp(name)
        model.save_pretrained(folder)
        out[name] = (folder, model)
    return out


@dataclass
class Stepper:
    """Runs our model step by step, owning slot allocation (shuffled, so tables are paged)."""

    model: torch.nn.Module
    attn: object
    free: list[int]
    tables: dict[str, list[int]] = field(default_factory=dict)
    tokens: dict[str, list[int]] = field(default_factory=dict)

    def step(self, new_tokens: dict[str, list[int]]) -> dict[str, torch.Tensor]:
        """One forward over a batch; returns each request's logits for its new tokens."""
        from localradix.step import ForwardBatch

        names, ids, tables, prefixes = list(new_tokens), [], [], []
        for name in names:
            table = self.tables.setdefault(name, [])
            prefixes.append(len(table))
            table += [self.free.pop() for _ in new_tokens[name]]
            self.tokens.setdefault(name, []).extend(new_tokens[name])
            ids.append(np.array(new_tokens[name], dtype=np.int64))
            tables.append(np.array(table, dtype=np.int64))
        batch = ForwardBatch.build(ids, tables, prefixes)
        self.attn.prepare(batch)
        with torch.inference_mode():
            hidden = self.model(
                torch.from_numpy(batch.input_ids), torch.from_numpy(batch.positions), self.attn
            )
            logits = self.model.compute_logits(hidden)
        bounds = batch.qo_indptr
        return {n: logits[bounds[i] : bounds[i + 1]] for i, n in enumerate(names)}


@pytest.fixture
def make_stepper():
    from localradix.model_api.attention import get_attention_backend

    def make(
        model: torch.nn.Module, config: object, num_slots: int = 512, seed: int = 0
    ) -> Stepper:
        backend = get_attention_backend("torch_native")
        attn = backend.from_model_config(config, num_slots, model.dtype, "cpu")
        free = list(np.random.default_rng(seed).permutation(np.arange(1, num_slots + 1)))
        return Stepper(model, attn, [int(s) for s in free])

    return make
