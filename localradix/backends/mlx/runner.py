"""MLXRunner: the ModelRunner for Apple MLX (Metal on Apple silicon, CPU elsewhere). No torch.

Per step: the ForwardBatch's numpy plan becomes MLX index arrays, the MLX decoder runs the mixed
extend/decode batch against the paged KV arrays, the logits of every row of `logit_index` (each
request's last token, or all k + 1 positions of a draft verify) are sampled in MLX, and the step ends with one `mx.eval` of the tokens and the KV arrays (so the lazy
graph never grows across steps). Hybrids (Qwen3.5, Qwen3-Next) keep their delta-nets' per-row
state in `MLXRecurrentStates`, evaluated with the step; it is also the runner's `snapshots`, whose
handles the radix cache holds to resume a request exactly where a snapshot was taken.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, cast

import mlx.core as mx
import numpy as np
import psutil

from localradix.backends.mlx.attention import MLXPagedAttention
from localradix.backends.mlx.kv_transfer import MLXKVTransfer
from localradix.backends.mlx.model import MLXDecoderForCausalLM
from localradix.backends.mlx.recurrent_state import MLXRecurrentStates
from localradix.backends.mlx.sampler import sample
from localradix.backends.mlx.weights import load_weights
from localradix.model_api.attention_spec import AttentionSpec
from localradix.model_api.kv_layout import KVLayout
from localradix.model_api.recurrent_plan import RecurrentLayout
from localradix.models.config import ModelConfig
from localradix.models.registry import is_supported
from localradix.runner.base import ModelRunner
from localradix.runner.kv_budget import plan_kv_budget, snapshot_budget
from localradix.step import ForwardBatch, SampleOutput, SamplingBatch

if TYPE_CHECKING:
    from localradix.backends.mlx.qwen3_5 import MLXQwen3_5ForCausalLM
    from localradix.platform import Target
    from localradix.runner.runner_config import RunnerConfig
    from localradix.store.source import ModelSource

logger = logging.getLogger("localradix.runner")

DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}
QWEN3_5_TYPES = ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next")  # gated delta-net hybrids


def mlx_lacks(c: ModelConfig) -> list[str]:
    """What `c` needs that the MLX models do not implement, by name (empty for the families
    they implement: the Llama-style decoder with its Phi-3, SmolLM3 and MoE variants, Gemma 3,
    Gemma 4, gpt-oss)."""
    gemma3, gpt_oss = c.model_type == "gemma3_text", c.model_type == "gpt_oss"
    gemma = gemma3 or c.gemma4 is not None  # (windows, scaled embeddings, soft-capped logits)
    hybrid = c.model_type in QWEN3_5_TYPES  # Qwen3.5, Qwen3.5-MoE, Qwen3-Next (qwen3_5.py)
    found = {
        "gated delta-net linear attention layers": any(c.linear_layers) and not hybrid,
        "gated attention output (Qwen3.5)": c.attn_output_gate and not hybrid,
        "shared experts": bool(c.shared_expert_size) and not hybrid,
        "sliding-window attention layers": bool(c.layer_windows()) and not (gemma or gpt_oss),
        "(1 + weight) RMSNorms": c.offset_norms and not (gemma3 or hybrid),
        "scaled embeddings": c.embed_scale != 1.0 and not gemma,
        "final logit soft-capping": bool(c.final_logit_softcap) and not gemma,
        "attention logit soft-capping (Gemma 2)": bool(c.attn_logit_softcap),
        "attention sinks": c.attention_sinks and not gpt_oss,
        "clamped SwiGLU experts with biases": bool(c.swiglu_limit) and not gpt_oss,
    }
    return [name for name, needed in found.items() if needed]


def mlx_model_class(c: ModelConfig) -> type[MLXDecoderForCausalLM]:
    if c.model_type == "gemma3_text":
        from localradix.backends.mlx.gemma3 import MLXGemma3ForCausalLM

        return MLXGemma3ForCausalLM
    if c.gemma4 is not None:
        from localradix.backends.mlx.gemma4 import MLXGemma4ForCausalLM

        return MLXGemma4ForCausalLM
    if c.model_type == "gpt_oss":
        from localradix.backends.mlx.gpt_oss import MLXGptOssForCausalLM

        return MLXGptOssForCausalLM
    if c.model_type in QWEN3_5_TYPES:
        from localradix.backends.mlx.qwen3_5 import MLXQwen3_5ForCausalLM

        return MLXQwen3_5ForCausalLM
    return MLXDecoderForCausalLM


def create_mlx_runner(
    args: RunnerConfig, source: ModelSource, target: Target
) -> tuple[MLXRunner, ModelConfig]:
    device = mx.Device(mx.gpu if target.device in ("gpu", "mps", "metal") else mx.cpu)
    with mx.stream(device):
        config, weights = load_weights(source, args.quantize)
        if not is_supported(config.architecture):
            raise ValueError(f"model architecture {config.architecture!r} is not supported by MLX")
        lacking = mlx_lacks(config)
        if lacking:
            raise ValueError(
                f"the MLX backend does not implement {', '.join(lacking)} "
                f"({config.architecture}): serve it with --backend cpu (or a GPU backend) "
                "or, as a GGUF, with --backend llamacpp"
            )
        model = mlx_model_class(config)(config, weights, DTYPES[target.dtype])
    del weights  # before the KV budget is taken from what memory is left
    logger.info("Weights: %.1f MiB resident in MLX arrays", model.weight_bytes / 2**20)
    return MLXRunner(model, config, args, device), config


class MLXRunner(ModelRunner):
    verifies = True  # `forward` samples every row of `logit_index`
    embeds = True  # `forward` pools the hidden states of `ForwardBatch.pooling`

    def __init__(
        self,
        model: MLXDecoderForCausalLM,
        config: ModelConfig,
        args: RunnerConfig,
        device: mx.Device,
    ) -> None:
        self.model, self.config, self.device = model, config, device
        self.dtype = model.dtype
        self.weight_bytes = model.weight_bytes
        # Hybrids (Qwen3.5): each request row's linear-attention state, allocated before the
        # KV pool is sized from what memory is left, and its snapshots for the radix cache.
        with mx.stream(device):
            self.states = _recurrent_states(config, args, self.dtype)
        self.snapshots = self.states
        if self.states is not None:
            self.verifies = False  # a recurrent state cannot take back rejected drafts
        shape = KVLayout.for_model(config, _name(self.dtype))
        context_len = args.context_length or config.max_position_embeddings
        available = int(psutil.virtual_memory().available)  # unified memory
        self.kv_budget = plan_kv_budget(args, shape, context_len, available)
        self.kv_capacity = self.kv_budget.tokens
        with mx.stream(device):
            spec = AttentionSpec.for_model(config, shape.layers)
            self.attn = MLXPagedAttention(shape.with_slots(self.kv_capacity), self.dtype, spec)
        self.kv_transfer = MLXKVTransfer(self.attn, device)
        logger.info("%s; MLX arrays on %s", self.kv_budget.describe(), device)

    def forward(self, batch: ForwardBatch, sampling: SamplingBatch) -> SampleOutput:
        with mx.stream(self.device):
            self.attn.prepare(batch)
            input_ids = mx.array(batch.input_ids.astype(np.int32))
            positions = mx.array(batch.positions.astype(np.int32))
            hidden = self._hidden(batch, input_ids, positions)
            last = mx.array(batch.logit_index.astype(np.int32))
            logits = self.model.compute_logits(hidden[last])
            states = [] if self.states is None else self.states.arrays()
            mx.eval(logits, self.attn.state(), states)
            out = sample(logits, sampling)
            return out if batch.pooling is None else replace(out, pooled=_pooled(hidden, batch))

    def _hidden(self, batch: ForwardBatch, input_ids: mx.array, positions: mx.array) -> mx.array:
        if self.states is None:
            return self.model.forward(input_ids, positions, self.attn)
        hybrid = cast("MLXQwen3_5ForCausalLM", self.model)  # (only hybrids have states)
        self.states.prepare(batch)  # (checks each row continues where its state is)
        return hybrid.forward(input_ids, positions, self.attn, self.states)


def _recurrent_states(
    config: ModelConfig, args: RunnerConfig, dtype: mx.Dtype
) -> MLXRecurrentStates | None:
    layout = RecurrentLayout.for_model(config)
    if layout is None:
        return None
    rows = args.max_running_requests + 2  # the scheduler's request-table rows
    states = MLXRecurrentStates(layout, rows, dtype, snapshot_budget(args.snapshot_mib))
    logger.info(
        "Recurrent state: %d linear-attention layers, %.1f MiB for %d request rows; "
        "snapshots up to %.0f MiB",
        layout.layers,
        states.nbytes / 2**20,
        rows,
        states.budget / 2**20,
    )
    return states


def _pooled(hidden: mx.array, batch: ForwardBatch) -> np.ndarray:
    """float32 [num_reqs, hidden]: each pooling request's last new state or the sum of its
    new states (as `localradix.runner.pooling` does for torch), zero rows for the others."""
    assert batch.pooling is not None
    out = np.zeros((batch.num_reqs, hidden.shape[-1]), dtype=np.float32)
    bounds = batch.qo_indptr.tolist()
    for i, mode in enumerate(batch.pooling):
        start, end = bounds[i], bounds[i + 1]
        if mode == "last":
            out[i] = np.array(hidden[end - 1].astype(mx.float32))
        elif mode == "mean":
            out[i] = np.array(hidden[start:end].astype(mx.float32).sum(axis=0))
    return out


def _name(dtype: mx.Dtype) -> str:
    return next(name for name, value in DTYPES.items() if value == dtype)
