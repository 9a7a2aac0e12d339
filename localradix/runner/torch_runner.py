"""The torch reference runner: any torch device (CPU here; CUDA/ROCm/NPU swap attention only)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
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
    def logits(self, batch: ForwardBatch, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """float32 logits [num_reqs, vocab] of each request's last new token, on the device.

        `input_ids` (on the device) overrides `batch.input_ids`, e.g. tokens sampled by the
        previous step that the host has not seen yet (see `localradix.runner.overlap`).
        """
        self.attn.prepare(batch)
        ids = input_ids if input_ids is not None else self._tensor(batch.input_ids)
        hidden = self.model.forward(ids, self._tensor(batch.positions), self.attn)
        if batch.num_tokens != batch.num_reqs:
            hidden = hidden[self._tensor(batch.last_token_index)]
        return self.model.compute_logits(hidden).float()

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, sampling: SamplingBatch) -> SampleOutput:
        return sample(self.logits(batch), sampling)

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(self.device, non_blocking=True)
