"""AttentionSpec: one typed value per model for what each layer's attention needs, read by every
backend; a backend that cannot apply a feature refuses by naming it, when made directly too."""

from __future__ import annotations

import pytest

from localradix.model_api.attention_spec import AttentionSpec, LayerAttention
from localradix.model_api.kv_layout import KVLayout
from localradix.runner.attention_torch import TorchNativeAttention


class _Config:
    architecture = "Toy"
    num_hidden_layers = 3
    num_key_value_heads, head_dim, num_attention_heads = 2, 8, 4
    attn_logit_softcap = 0.0
    attention_sinks = False

    def __init__(self, windows: tuple[int, ...] = ()) -> None:
        self._windows = windows

    def layer_windows(self) -> tuple[int, ...]:
        return self._windows


def test_the_spec_reads_windows_caps_and_sinks_from_the_config():
    config = _Config((0, 4, 0))
    config.attention_sinks = True
    spec = AttentionSpec.for_model(config, 3)
    assert spec.windows == (0, 4, 0) and spec.logit_caps == (0.0, 0.0, 0.0)
    assert spec.layers[1] == LayerAttention(window=4, sinks=True)
    assert spec.needs() == {
        "sliding-window attention": True,
        "attention logit soft-caps": False,
        "attention sinks": True,
    }
    assert not any(AttentionSpec.for_model(_Config(), 3).needs().values())
    with pytest.raises(ValueError, match="one window >= 0"):
        AttentionSpec.of((0, -1))


def test_backends_apply_the_spec_or_refuse_it_by_name():
    layout = KVLayout(3, 2, 8, "float32", 16)
    attn = TorchNativeAttention(layout, "cpu", AttentionSpec.of((0, 4, 0)))
    assert attn.windows == (0, 4, 0)
    with pytest.raises(ValueError, match="cannot apply attention logit soft-caps"):
        TorchNativeAttention(layout, "cpu", AttentionSpec.of((0, 0, 0), (30.0, 30.0, 30.0)))
    with pytest.raises(ValueError, match="one layer spec per KV layer"):
        TorchNativeAttention(layout, "cpu", AttentionSpec.of((0, 4)))
    built = TorchNativeAttention.from_model_config(_Config((2, 0, 2)), 16, attn.dtype, "cpu")
    assert isinstance(built, TorchNativeAttention) and built.spec.windows == (2, 0, 2)
