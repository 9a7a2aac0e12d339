"""The torch reference runner: any torch device (CPU here; CUDA/ROCm/NPU swap attention only)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np
import psutil
import torch

from localradix.model_api.attention import AttentionBackend, get_attention_backend
from localradix.model_api.kv_layout import KVLayout
from localradix.model_api.recurrent_plan import RecurrentLayout
from localradix.model_api.recurrent_state import RecurrentStates
from localradix.runner.base import ModelRunner
from localradix.runner.kv_budget import kv_tokens_from_memory as kv_tokens_from_memory  # re-export
from localradix.runner.kv_budget import plan_kv_budget, snapshot_budget
from localradix.runner.kv_transfer import TorchKVTransfer
from localradix.runner.pooling import pool_hidden
from localradix.runner.runner_config import RunnerConfig
from localradix.runner.sampler import DeviceSample, sample_on_device
from localradix.step import ForwardBatch, SampleOutput, SamplingBatch

logger = logging.getLogger("localradix.runner")


def free_device_memory(device: torch.device | str) -> int:
    """Free bytes on `device` (host RAM available for the CPU)."""
    dev = torch.device(device)
    if dev.type == "cpu":
        return int(psutil.virtual_memory().available)
    api: Any = getattr(torch, dev.type)  # torch.cuda (also ROCm), torch.npu with torch_npu
    free, _ = api.mem_get_info(dev)
    return int(free)


def device_event(device: torch.device | str) -> Any:
    """An event recorded on the device's current stream (None on the CPU: nothing is queued)."""
    kind = torch.device(device).type
    if kind == "cpu":
        return None
    event = getattr(torch, kind).Event()
    event.record()
    return event


def resident_bytes(model: Any) -> int | None:
    """Bytes of a torch model's parameters and buffers (tied ones once); None if not a Module."""
    if not isinstance(model, torch.nn.Module):
        return None
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.nbytes for t in tensors)


def _kv_transfer(attn: AttentionBackend) -> TorchKVTransfer | None:
    """Host copies of the backend's KV slots, when it keeps them in `k_cache`/`v_cache` (or,
    for KV layers of mixed shapes, in one pair per shape: `kv_groups`)."""
    groups = getattr(attn, "kv_groups", None)
    if groups:
        return TorchKVTransfer(*groups[0], *groups[1:])
    k, v = getattr(attn, "k_cache", None), getattr(attn, "v_cache", None)
    if isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor):
        return TorchKVTransfer(k, v)
    return None


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class TorchRunner(ModelRunner):
    verifies = True  # `logits` gathers every row of `logit_index`
    embeds = True  # `logits` pools the hidden states of `ForwardBatch.pooling` into `pooled`
    pooled: torch.Tensor | None = None  # set by each `logits` call (None: nothing pooled)

    def __init__(
        self,
        model: Any,
        config: Any,
        args: RunnerConfig,
        device: torch.device | str,
        dtype: torch.dtype,
        attention_backend: str = "torch_native",
        *,
        kv_dtype: torch.dtype | None = None,  # the cache's, when narrower than the model's
    ) -> None:
        self.model, self.config, self.device, self.dtype = model, config, device, dtype
        self.page_size = args.page_size
        self.weight_bytes = resident_bytes(model)
        # Hybrids (Qwen3.5): each request row's linear-attention state, allocated before the
        # KV pool is sized from what memory is left, and snapshots of it for the radix cache.
        self.states = self._recurrent_states(config, args, dtype, device)
        self.snapshots = self.states
        if self.states is not None:
            self.verifies = False  # a recurrent state cannot take back rejected drafts
        backend_cls = get_attention_backend(attention_backend)
        kv_dtype = kv_dtype or dtype
        if kv_dtype != dtype and not backend_cls.kv_dtype_may_differ:
            raise ValueError(f"{attention_backend} attention keeps K/V in the model's dtype")
        shape = KVLayout.for_model(config, _name(kv_dtype))
        context_len = args.context_length or config.max_position_embeddings
        self.kv_budget = plan_kv_budget(args, shape, context_len, free_device_memory(device))
        self.kv_capacity = self.kv_budget.tokens
        self.attn: AttentionBackend = backend_cls.from_model_config(
            config, self.kv_capacity, kv_dtype, device, page_size=self.page_size
        )
        self.kv_transfer = _kv_transfer(self.attn)
        logger.info(self.kv_budget.describe())
        logger.info(
            "KV cache on %s: page size %d, %s attention", device, self.page_size, attention_backend
        )

    @torch.inference_mode()
    def logits(self, batch: ForwardBatch, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """float32 logits [num_rows, vocab] of each sampled position (`batch.logit_index`: each
        request's last new token, or its verify positions), on the device.

        `input_ids` (on the device) overrides `batch.input_ids`, e.g. tokens sampled by the
        previous step that the host has not seen yet (see `localradix.runner.overlap`).
        """
        self.attn.prepare(batch)
        ids = input_ids if input_ids is not None else self._tensor(batch.input_ids)
        positions = self._tensor(batch.positions)
        if self.states is None:
            hidden = self.model.forward(ids, positions, self.attn)
        else:
            self.states.prepare(batch)
            hidden = self.model.forward(ids, positions, self.attn, self.states)
        self.pooled = pool_hidden(hidden, batch)
        if batch.num_tokens != batch.num_rows:
            hidden = hidden[self._tensor(batch.logit_index)]
        return self.model.compute_logits(hidden).float()

    @torch.inference_mode()
    def sample_step(
        self, batch: ForwardBatch, sampling: SamplingBatch, input_ids: torch.Tensor | None = None
    ) -> DeviceSample:
        """Run `batch` and sample it, leaving the results on the device (see `logits`)."""
        return sample_on_device(self.logits(batch, input_ids), sampling)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, sampling: SamplingBatch) -> SampleOutput:
        # A copy even on the CPU: a graph's ids live in a buffer its next replay rewrites.
        out = self.sample_step(batch, sampling).map(lambda t: t.to("cpu", copy=True)).numpy()
        if batch.pooling is None or self.pooled is None:
            return out
        return dataclasses.replace(out, pooled=self.pooled.cpu().numpy())

    @staticmethod
    def _recurrent_states(
        config: Any, args: RunnerConfig, dtype: torch.dtype, device: torch.device | str
    ) -> RecurrentStates | None:
        layout = RecurrentLayout.for_model(config)
        if layout is None:
            return None
        rows = args.max_running_requests + 2  # the scheduler's request-table rows
        budget = snapshot_budget(args.snapshot_mib)
        states = RecurrentStates(layout, rows, dtype, device, budget)
        logger.info(
            "Recurrent state: %d linear-attention layers, %.1f MiB for %d request rows; "
            "snapshots up to %.0f MiB (host memory)",
            layout.layers,
            states.nbytes / 2**20,
            rows,
            budget / 2**20,
        )
        return states

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(self.device, non_blocking=True)
