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

import torch

from localradix.backends.cuda.graphs import DecodeGraphs, GraphApi, graph_batch_sizes
from localradix.runner.sampler import DeviceSample, sample_on_device
from localradix.runner.torch_runner import TorchRunner
from localradix.step import ForwardBatch, SamplingBatch

if TYPE_CHECKING:
    from localradix.platform import Target
    from localradix.runner.runner_config import RunnerConfig
    from localradix.store.source import ModelSource

logger = logging.getLogger("localradix.runner")

DISABLE_GRAPHS_ENV = "LOCALRADIX_DISABLE_CUDA_GRAPH"  # "1": run every decode step eagerly
HALF_DTYPES = ("bfloat16", "float16")


def choose_attention(
    requested: str, dtype: str, flashinfer_ok: bool, triton_ok: bool = False
) -> tuple[str, str]:
    """(attention backend, why) for a CUDA runner: FlashInfer where it can run, else Triton,
    else torch-native."""
    if requested != "flashinfer":
        return requested, f"{requested} requested"
    if not flashinfer_ok:
        choice = ("torch_native", "flashinfer is not installed (pip install flashinfer-python)")
    elif dtype not in HALF_DTYPES:
        choice = ("torch_native", f"FlashInfer has no {dtype} kernels")
    else:
        choice = ("flashinfer", "FlashInfer paged attention")
    return triton_unless_flashinfer(choice, triton_ok)


def triton_unless_flashinfer(choice: tuple[str, str], triton_ok: bool) -> tuple[str, str]:
    """Where FlashInfer cannot run, the Triton kernels do when Triton is installed."""
    name, why = choice
    if name == "torch_native" and triton_ok:
        return "triton", f"Triton paged attention ({why})"
    return choice


def create_cuda_runner(args: RunnerConfig, source: ModelSource, target: Target) -> tuple[Any, Any]:
    has_flashinfer = importlib.util.find_spec("flashinfer") is not None
    has_triton = importlib.util.find_spec("triton") is not None
    attention, why = choose_attention(
        target.attention_backend, target.dtype, has_flashinfer, has_triton
    )
    logger.info("CUDA attention: %s (%s)", attention, why)
    if args.tp > 1:  # NCCL between the ranks; no decode graphs (untested on GPUs so far)
        from localradix.loader import resolve_dtype
        from localradix.runner.tp.runner import create_tp_runner

        dtype = resolve_dtype(target.dtype, target.device)
        return create_tp_runner(args, source, target, attention, dtype)
    return create_device_runner(args, source, target, attention)


def create_device_runner(
    args: RunnerConfig, source: ModelSource, target: Target, attention: str
) -> tuple[DeviceRunner, Any]:
    from localradix.backends.torch_device import load_torch_model

    model, config, dtype = load_torch_model(args, source, target)
    mixed = bool(getattr(config, "kv_layer_shapes", ()))  # Gemma 4's per-layer head sizes
    if attention == "flashinfer" and (
        any(config.layer_windows()) or config.attention_sinks or mixed
    ):
        # FlashInfer's paged kernels here take no per-layer windows, sinks or KV shapes: Triton's do
        has_triton = importlib.util.find_spec("triton") is not None
        attention = "triton" if has_triton else "torch_native"
        logger.info(
            "CUDA attention: %s (sliding-window layers, attention sinks or mixed KV shapes)",
            attention,
        )
    graphs = os.environ.get(DISABLE_GRAPHS_ENV, "") not in ("1", "true")
    runner = DeviceRunner(model, config, args, target.device, dtype, attention, graphs=graphs)
    return runner, config


class DeviceRunner(TorchRunner):
    """`TorchRunner` plus CUDA-graph replay of decode steps."""

    def __init__(
        self,
        model: Any,
        config: Any,
        args: RunnerConfig,
        device: torch.device | str,
        dtype: torch.dtype,
        attention: str = "flashinfer",
        *,
        graphs: bool = True,
        graph_api: GraphApi | None = None,
    ) -> None:
        super().__init__(model, config, args, device, dtype, attention)
        self.graphs: DecodeGraphs | None = None
        if graphs and self.states is not None:  # (the graphs do not take the states' plan)
            logger.info("CUDA graphs off: the model has recurrent layers; decode runs eagerly")
        elif graphs and hasattr(self.attn, "graph_state"):
            self.graphs = self._capture_graphs(args, graph_api)

    def _capture_graphs(self, args: RunnerConfig, api: GraphApi | None) -> DecodeGraphs | None:
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
        if self._graph_runs(batch):
            assert self.graphs is not None
            return self.graphs.run(batch, input_ids)
        return super().logits(batch, input_ids)

    @torch.inference_mode()
    def sample_step(
        self, batch: ForwardBatch, sampling: SamplingBatch, input_ids: torch.Tensor | None = None
    ) -> DeviceSample:
        """A graph-run decode step samples inside the graph when its sampler can (see
        `SamplingBuffers`); otherwise, and for eager steps, the logits are sampled after."""
        if not self._graph_runs(batch):
            return super().sample_step(batch, sampling, input_ids)
        assert self.graphs is not None
        logits, tokens = self.graphs.run_sampled(batch, sampling, input_ids)
        return DeviceSample(tokens) if tokens is not None else sample_on_device(logits, sampling)

    def _graph_runs(self, batch: ForwardBatch) -> bool:
        # A batch that pools (embeddings) needs the hidden states, which a graph does not keep.
        return self.graphs is not None and batch.pooling is None and self.graphs.can_run(batch)
