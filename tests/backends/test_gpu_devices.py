"""The device backends on real hardware; each test is skipped where its device or package is absent.

The same checks as the CPU tests with fakes (test_gpu_backends_cpu.py), against the real
kernels: FlashInfer vs the torch-native reference, decode graphs vs eager steps, overlapped vs
plain steps, and the fused NPU decode. `scripts/gpu_check.py` is the end-to-end GPU check.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from localradix.config import ServerArgs
from localradix.model_api.kv_layout import KVLayout

from .gpu_fakes import PagedSlots
from .test_gpu_backends_cpu import _greedy, _prompt, _random_qkv, _reference_logits

HAS_CUDA = torch.cuda.is_available()
HAS_FLASHINFER = importlib.util.find_spec("flashinfer") is not None
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA/ROCm device visible")
requires_flashinfer = pytest.mark.skipif(
    not (HAS_CUDA and HAS_FLASHINFER), reason="needs a CUDA device and flashinfer"
)
requires_npu = pytest.mark.skipif(
    importlib.util.find_spec("torch_npu") is None, reason="torch_npu is not installed"
)


@requires_flashinfer
@pytest.mark.parametrize("page_size", [1, 16])
def test_flashinfer_matches_torch_native_on_gpu(page_size):
    from localradix.backends.cuda.attention import FlashInferAttention
    from localradix.runner.attention_torch import TorchNativeAttention

    layout = KVLayout(2, 2, 16, "bfloat16", 96 * page_size - 1, page_size)
    fi = FlashInferAttention(layout, "cuda", num_heads=8)
    ref = TorchNativeAttention(layout, "cuda")
    slots = PagedSlots(96, page_size, seed=1)
    for i, new in enumerate(
        [{"a": list(range(40)), "b": list(range(9))}, {"a": [1], "c": list(range(5))}, {"a": [2]}]
    ):
        batch = slots.batch(new)
        fi.prepare(batch)
        ref.prepare(batch)
        q, k, v = (t.cuda() for t in _random_qkv(batch, seed=i))
        q = q.repeat_interleave(2, dim=1)  # 8 query heads
        got = fi.forward(q, k, v, 0, 16**-0.5)
        want = ref.forward(q, k, v, 0, 16**-0.5)
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


@requires_cuda
def test_device_runner_graphs_match_eager_on_gpu(tiny_model):
    from localradix.backends.cuda.runner import DeviceRunner
    from localradix.loader import load_model
    from localradix.runner.attention_torch import TorchNativeAttention

    attention = "flashinfer" if HAS_FLASHINFER else "torch_native"
    folder, _ = tiny_model("llama")
    model, config = load_model(str(folder), "bfloat16", "cuda")
    args = ServerArgs(max_total_tokens=1023, max_running_requests=8, context_length=256)
    runner = DeviceRunner(model, config, args, "cuda", torch.bfloat16, attention)
    ref = TorchNativeAttention.from_model_config(config, 1023, torch.bfloat16, "cuda")
    slots = PagedSlots(1024, 1, seed=2)
    for new in [
        {"a": _prompt(20, 1), "b": _prompt(7, 2), "c": _prompt(3, 3)},
        {"a": [5], "b": [6], "c": [7]},
        {"a": [8], "b": [9]},
        {"c": [10], "d": _prompt(9, 4)},
        {"a": [11], "b": [12], "c": [13], "d": [14]},
    ]:
        batch = slots.batch(new)
        got = runner.logits(batch)
        want = _reference_logits(model, ref, batch)
        torch.testing.assert_close(got, want, atol=0.05 * float(want.abs().max()), rtol=0)


@requires_cuda
def test_overlap_matches_plain_steps_on_gpu(tiny_model):
    from localradix.backends.cuda.runner import DeviceRunner
    from localradix.loader import load_model
    from localradix.runner.overlap import OverlapRunner

    folder, _ = tiny_model("llama")
    model, config = load_model(str(folder), "float32", "cuda")
    args = ServerArgs(max_total_tokens=1023, max_running_requests=4)
    prompts = {"a": _prompt(6, 1), "b": _prompt(9, 2)}
    sequences = []
    for overlapped in (False, True):
        base = DeviceRunner(model, config, args, "cuda", torch.float32, "torch_native")
        runner, slots, seq = OverlapRunner(base, capacity=16), PagedSlots(1024, 1), []
        pending = runner.launch(slots.batch(prompts), _greedy(2))
        for _ in range(6):
            if overlapped:
                new = {n: [int(p)] for n, p in zip(prompts, pending.placeholders)}
                nxt = runner.launch(slots.batch(new), _greedy(2))
                seq.append(pending.result().token_ids.tolist())
            else:
                tokens = pending.result().token_ids
                seq.append(tokens.tolist())
                new = {n: [int(t)] for n, t in zip(prompts, tokens)}
                nxt = runner.launch(slots.batch(new), _greedy(2))
            pending = nxt
        sequences.append(seq)
    assert sequences[0] == sequences[1]


@requires_npu
def test_npu_fused_decode_on_device():
    import torch_npu  # noqa: F401

    from localradix.backends.npu.attention import NpuFusedAttention
    from localradix.runner.attention_torch import TorchNativeAttention

    layout = KVLayout(1, 2, 64, "bfloat16", 64 * 16 - 1, 16)
    npu = NpuFusedAttention(layout, "npu", num_heads=8)
    ref = TorchNativeAttention(layout, "npu")
    slots = PagedSlots(64, 16, seed=3)
    slots.batch({"a": list(range(30)), "b": list(range(5))})
    batch = slots.batch({"a": [1], "b": [2]})
    npu.prepare(batch)
    ref.prepare(batch)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 64, generator=g).to(torch.bfloat16).to("npu")
    k, v = (torch.randn(2, 2, 64, generator=g).to(torch.bfloat16).to("npu") for _ in range(2))
    got = npu.forward(q, k, v, 0, 64**-0.5)
    assert npu.fused, "the fused op fell back to torch-native"
    torch.testing.assert_close(
        got.float(), ref.forward(q, k, v, 0, 64**-0.5).float(), atol=2e-2, rtol=2e-2
    )
    assert np.isfinite(got.float().cpu().numpy()).all()
