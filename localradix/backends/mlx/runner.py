"""MLXRunner: the ModelRunner for Apple MLX (Metal on Apple silicon, CPU elsewhere). No torch.

Per step: the ForwardBatch's numpy plan becomes MLX index arrays, the MLX decoder runs the mixed
extend/decode batch against the paged KV arrays, the logits of every row of `logit_index` (each
request's last token, or all k + 1 positions of a draft verify) are sampled in MLX, and the step ends with one `mx.eval` of the tokens and the KV arrays (so the lazy
graph never grows across steps).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np
import psutil

from localradix.backends.mlx.attention import MLXPagedAttention
from localradix.backends.mlx.kv_transfer import MLXKVTransfer
from localradix.backends.mlx.model import MLXDecoderForCausalLM
from localradix.backends.mlx.sampler import sample
from localradix.backends.mlx.weights import load_weights
from localradix.models.config import ModelConfig
from localradix.models.registry import is_supported
from localradix.runner.base import ModelRunner
from localradix.runner.kv_budget import plan_kv_budget
from localradix.runner.kv_layout import KVLayout
from localradix.step import ForwardBatch, SampleOutput, SamplingBatch

if TYPE_CHECKING:
    from localradix.config import ServerArgs
    from localradix.platform import Target
    from localradix.store.source import ModelSource

logger = logging.getLogger("localradix.runner")

DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


def create_mlx_runner(
    args: ServerArgs, source: ModelSource, target: Target
) -> tuple[MLXRunner, ModelConfig]:
    device = mx.Device(mx.gpu if target.device in ("gpu", "mps", "metal") else mx.cpu)
    with mx.stream(device):
        config, weights = load_weights(source, args.quantize)
        if not is_supported(config.architecture):
            raise ValueError(f"model architecture {config.architecture!r} is not supported by MLX")
        if config.extensions():  # the torch decoder has them, the MLX twin not yet
            raise ValueError(
                f"the MLX backend does not implement {', '.join(config.extensions())} "
                f"({config.architecture}): serve it with --backend cpu (or a GPU backend)"
            )
        model = MLXDecoderForCausalLM(config, weights, DTYPES[target.dtype])
    del weights  # before the KV budget is taken from what memory is left
    logger.info("Weights: %.1f MiB resident in MLX arrays", model.weight_bytes / 2**20)
    return MLXRunner(model, config, args, device), config


class MLXRunner(ModelRunner):
    verifies = True  # `forward` samples every row of `logit_index`
    embeds = True  # `forward` pools the hidden states of `ForwardBatch.pooling`

    def __init__(
        self, model: MLXDecoderForCausalLM, config: ModelConfig, args: ServerArgs, device: mx.Device
    ) -> None:
        self.model, self.config, self.device = model, config, device
        self.dtype = model.dtype
        self.weight_bytes = model.weight_bytes
        shape = KVLayout.for_model(config, _name(self.dtype))
        context_len = args.context_length or config.max_position_embeddings
        available = int(psutil.virtual_memory().available)  # unified memory
        self.kv_budget = plan_kv_budget(args, shape, context_len, available)
        self.kv_capacity = self.kv_budget.tokens
        with mx.stream(device):
            self.attn = MLXPagedAttention(shape.with_slots(self.kv_capacity), self.dtype)
        self.kv_transfer = MLXKVTransfer(self.attn, device)
        logger.info("%s; MLX arrays on %s", self.kv_budget.describe(), device)

    def forward(self, batch: ForwardBatch, sampling: SamplingBatch) -> SampleOutput:
        with mx.stream(self.device):
            self.attn.prepare(batch)
            input_ids = mx.array(batch.input_ids.astype(np.int32))
            positions = mx.array(batch.positions.astype(np.int32))
            hidden = self.model.forward(input_ids, positions, self.attn)
            last = mx.array(batch.logit_index.astype(np.int32))
            logits = self.model.compute_logits(hidden[last])
            mx.eval(logits, self.attn.state())
            out = sample(logits, sampling)
            return out if batch.pooling is None else replace(out, pooled=_pooled(hidden, batch))


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
