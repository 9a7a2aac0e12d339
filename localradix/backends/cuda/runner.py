"""DeviceRunner: the reference runner's accelerator variant (CUDA, ROCm, Ascend NPU).

Same model, scheduler and cache as the CPU runner; what changes per device is the attention
backend (FlashInfer, vendor ops, or the torch-native reference), CUDA-graph capture of decode
steps, and a KV pool sized from free device memory x `--mem-fraction`. Sampling runs on the
device: only the chosen token ids (and logprobs when asked) are copied to the host.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import TYPE_CHECKING, Any

import psutil
import torch

from localradix.runner.attention import get_attention_backend
from localradix.runner.cuda_graphs import DecodeGraphs, GraphApi, graph_batch_sizes
from localradix.runner.torch_runner import TorchRunner
from localradix.sched.batch import ForwardBatch

if TYPE_CHECKING:
    from localradix.config import ServerArgs
    from localradix.loader.source import ModelSource
    from localradix.platform import Target

logger = logging.getLogger("localradix.runner")

DISABLE_GRAPHS_ENV = "LOCALRADIX_DISABLE_CUDA_GRAPH"  # "1": run every decode step eagerly
HALF_DTYPES = ("bfloat16", "float16")


def choose_attention(requested: str, dtype: str, flashinfer_ok: bool) -> tuple[str, str]:
    """(attention backend, why) for a CUDA/ROCm runner: FlashInfer where it can run."""
    if requested != "flashinfer":
        return requested, f"{requested} requested"
    if not flashinfer_ok:
        return "torch_native", "flashinfer is not installed (pip install 'localradix[cuda]')"
    if dtype not in HALF_DTYPES:
        return "torch_native", f"FlashInfer has no {dtype} kernels"
    return "flashinfer", "FlashInfer paged attention"


def kv_tokens_from_memory(free_bytes: int, fraction: float, bytes_per_token: int) -> int:
    """KV slots that `fraction` of `free_bytes` holds (at least 1024)."""
    return max(int(free_bytes * fraction) // bytes_per_token, 1024)


def free_device_memory(device: torch.device | str) -> int:
    """Free bytes on `device` (host RAM available for the CPU)."""
    dev = torch.device(device)
    if dev.type == "cpu":
        return int(psutil.virtual_memory().available)
    api: Any = getattr(torch, dev.type)  # torch.cuda (also ROCm), torch.npu with torch_npu
    free, _ = api.mem_get_info(dev)
    return int(free)


def create_cuda_runner(args: ServerArgs, source: ModelSource, target: Target) -> tuple[Any, Any]:
    has_flashinfer = importlib.util.find_spec("flashinfer") is not None
    attention, why = choose_attention(target.attention_backend, target.dtype, has_flashinfer)
    logger.info("CUDA attention: %s (%s)", attention, why)
    return create_device_runner(args, source, target, attention)


def create_device_runner(
    args: ServerArgs, source: ModelSource, target: Target, attention: str
) -> tuple[DeviceRunner, Any]:
    from localradix.loader import load_model, resolve_dtype

    dtype = resolve_dtype(target.dtype, target.device)
    model, config = load_model(
        source, dtype=dtype, device=target.device, max_positions=args.context_length
    )
    graphs = os.environ.get(DISABLE_GRAPHS_ENV, "") not in ("1", "true")
    runner = DeviceRunner(model, config, args, target.device, dtype, attention, graphs=graphs)
    return runner, config


class DeviceRunner(TorchRunner):
    """`TorchRunner` plus page-size-aware attention, decode graphs and device-memory sizing."""

    def __init__(
        self,
        model: Any,
        config: Any,
        args: ServerArgs,
        device: torch.device | str,
        dtype: torch.dtype,
        attention: str = "flashinfer",
        *,
        graphs: bool = True,
        graph_api: GraphApi | None = None,
    ) -> None:
        self.model, self.config, self.device, self.dtype = model, config, device, dtype
        self.page_size = args.page_size
        backend_cls = get_attention_backend(attention)
        per_token = backend_cls.kv_bytes_per_token(
            config.num_hidden_layers, config.num_key_value_heads, config.head_dim, dtype
        )
        self.kv_capacity = args.max_total_tokens or kv_tokens_from_memory(
            free_device_memory(device), args.mem_fraction, per_token
        )
        self.attn = backend_cls.from_model_config(
            config, self.kv_capacity, dtype, device, page_size=self.page_size
        )
        logger.info(
            "KV cache: %d tokens (%.1f MiB, page size %d) on %s, %s, %s attention",
            self.kv_capacity,
            self.kv_capacity * per_token / 2**20,
            self.page_size,
            device,
            str(dtype).removeprefix("torch."),
            attention,
        )
        self.graphs: DecodeGraphs | None = None
        if graphs and hasattr(self.attn, "graph_state"):
            self.graphs = self._capture_graphs(args, graph_api)

    def _capture_graphs(self, args: ServerArgs, api: GraphApi | None) -> DecodeGraphs | None:
        sizes = graph_batch_sizes(args.max_running_requests)
        if not sizes:
            return None
        context = args.context_length or self.config.max_position_embeddings
        pages_per_req = -(-(context + 1) // self.page_size)
        graphs = DecodeGraphs(self.model, self.attn, sizes, pages_per_req, self.device, api)
        try:
            graphs.capture()
        except Exception as exc:  # a kernel that cannot be captured must not stop the server
            logger.warning(
                "CUDA graph capture failed (%s: %s); decode runs eagerly", type(exc).__name__, exc
            )
            return None
        return graphs

    @torch.inference_mode()
    def logits(self, batch: ForwardBatch, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        if self.graphs is not None and self.graphs.can_run(batch):
            return self.graphs.run(batch, input_ids)
        return super().logits(batch, input_ids)
