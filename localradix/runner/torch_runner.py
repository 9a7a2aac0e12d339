"""The torch reference runner: any torch device (CPU here; CUDA/ROCm/NPU swap attention only)."""

from __future__ import annotations

import logging
from typing import Any

import psutil
import torch

from localradix.config import ServerArgs
from localradix.runner.attention import AttentionBackend, get_attention_backend
from localradix.runner.base import ModelRunner, SampleOutput, SamplingBatch
from localradix.runner.sampler import sample
from localradix.sched.batch import ForwardBatch

logger = logging.getLogger("localradix.runner")

# The KV pool never takes more than this many tokens unless asked with --max-total-tokens:
# a desktop default that leaves memory for everything else.
DEFAULT_MAX_KV_TOKENS = 262_144


class TorchRunner(ModelRunner):
    def __init__(
        self,
        model: Any,
        config: Any,
        args: ServerArgs,
        device: torch.device | str,
        dtype: torch.dtype,
        attention_backend: str = "torch_native",
    ) -> None:
        self.model, self.config, self.device, self.dtype = model, config, device, dtype
        backend_cls = get_attention_backend(attention_backend)
        self.kv_capacity = args.max_total_tokens or self._capacity_from_memory(
            backend_cls, args.mem_fraction
        )
        self.attn: AttentionBackend = backend_cls.from_model_config(
            config, self.kv_capacity, dtype, device
        )
        logger.info(
            "KV cache: %d tokens (%.1f MiB) on %s, %s",
            self.kv_capacity,
            self.kv_capacity * self._bytes_per_token(backend_cls) / 2**20,
            device,
            str(dtype).removeprefix("torch."),
        )

    def _bytes_per_token(self, backend_cls: type[AttentionBackend]) -> int:
        c = self.config
        return backend_cls.kv_bytes_per_token(
            c.num_hidden_layers, c.num_key_value_heads, c.head_dim, self.dtype
        )

    def _capacity_from_memory(self, backend_cls: type[AttentionBackend], fraction: float) -> int:
        free = self._free_memory()
        tokens = int(free * fraction) // self._bytes_per_token(backend_cls)
        return max(min(tokens, DEFAULT_MAX_KV_TOKENS), 1024)

    def _free_memory(self) -> int:
        if str(self.device).startswith("cuda"):
            free, _ = torch.cuda.mem_get_info(torch.device(self.device))
            return int(free)
        return int(psutil.virtual_memory().available)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, sampling: SamplingBatch) -> SampleOutput:
        self.attn.prepare(batch)
        input_ids = torch.from_numpy(batch.input_ids).to(self.device)
        positions = torch.from_numpy(batch.positions).to(self.device)
        hidden = self.model.forward(input_ids, positions, self.attn)
        last = torch.from_numpy(batch.last_token_index).to(self.device)
        logits = self.model.compute_logits(hidden[last]).float()
        return sample(logits, sampling)
