"""KVLayout: one description of the KV cache for the budget and every attention backend."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from localradix.model_api.attention import AttentionBackend, get_attention_backend
from localradix.model_api.kv_layout import KVLayout

SMOLLM = SimpleNamespace(num_hidden_layers=30, num_key_value_heads=3, head_dim=64)


def test_sizes() -> None:
    layout = KVLayout.for_model(SMOLLM, "bfloat16")
    assert layout == KVLayout(30, 3, 64, "bfloat16")
    assert layout.layer_bytes_per_token == 2 * 3 * 64 * 2
    assert layout.bytes_per_token == 30 * layout.layer_bytes_per_token
    assert KVLayout(30, 3, 64, "float32").bytes_per_token == 2 * layout.bytes_per_token
    sized = layout.with_slots(100).with_page_size(16)
    assert sized.slot_shape == (101, 3, 64)  # slot 0 is the dummy
    assert sized.pages == 7  # ceil(101 / 16)
    assert AttentionBackend.kv_bytes_per_token(30, 3, 64, torch.bfloat16) == layout.bytes_per_token


def test_attention_backends_allocate_from_the_layout() -> None:
    attn = get_attention_backend("torch_native").from_model_config(
        SMOLLM, 10, torch.bfloat16, "cpu"
    )
    assert attn.layout == KVLayout(30, 3, 64, "bfloat16", slots=10)
    assert attn.k_cache.shape == (30, *attn.layout.slot_shape)
