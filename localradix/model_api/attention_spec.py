"""What each layer's attention needs beyond q, k and v, as one typed value per model.

Built once from the config (`AttentionSpec.for_model`), handed to the attention backend when it
is made, so every backend (torch-native, Triton, FlashInfer, MLX) reads a layer's window,
logit soft-cap and sinks from the same place, and one that cannot apply a feature refuses the
model by naming it. Weights stay with the model: a layer's sink logits come with each call.
RoPE stays in model code too (it is applied to q and k before they reach the backend).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LayerAttention:
    window: int = 0  # a query at p sees keys p - window < j <= p; 0: every earlier key
    logit_cap: float = 0.0  # scores become cap * tanh(score / cap); 0: not capped
    sinks: bool = False  # a learned logit per query head joins the softmax (given per call)


@dataclass(frozen=True)
class AttentionSpec:
    layers: tuple[LayerAttention, ...]

    @classmethod
    def plain(cls, num_layers: int) -> AttentionSpec:
        return cls((LayerAttention(),) * num_layers)

    @classmethod
    def for_model(cls, config: Any, num_layers: int) -> AttentionSpec:
        """One entry per KV layer of a `ModelConfig` (anything with the fields used)."""
        windows = tuple(config.layer_windows()) if hasattr(config, "layer_windows") else ()
        cap = float(getattr(config, "attn_logit_softcap", 0.0) or 0.0)
        sinks = bool(getattr(config, "attention_sinks", False))
        return cls.of(windows or (0,) * num_layers, (cap,) * num_layers, sinks)

    @classmethod
    def of(
        cls, windows: tuple[int, ...], logit_caps: tuple[float, ...] = (), sinks: bool = False
    ) -> AttentionSpec:
        """From per-layer windows (and caps: none when empty)."""
        caps = logit_caps or (0.0,) * len(windows)
        if len(caps) != len(windows) or min(windows, default=0) < 0:
            raise ValueError(f"need one window >= 0 and one cap per layer: {windows}, {caps}")
        return cls(tuple(LayerAttention(int(w), float(c), sinks) for w, c in zip(windows, caps)))

    @property
    def windows(self) -> tuple[int, ...]:
        return tuple(layer.window for layer in self.layers)

    @property
    def logit_caps(self) -> tuple[float, ...]:
        return tuple(layer.logit_cap for layer in self.layers)

    def needs(self) -> dict[str, bool]:
        """Which features some layer needs, by the name a refusal shows."""
        return {
            "sliding-window attention": any(layer.window for layer in self.layers),
            "attention logit soft-caps": any(layer.logit_cap for layer in self.layers),
            "attention sinks": any(layer.sinks for layer in self.layers),
        }
