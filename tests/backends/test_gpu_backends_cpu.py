"""CPU tests of the CUDA / ROCm / NPU backends' host-side pieces (no accelerator needed).

FlashInfer, CUDA graphs and torch_npu are replaced by the fakes in `gpu_fakes.py`, which follow
those libraries' documented semantics; what is tested is our side of each seam: page tables and
kernel index arrays, graph buckets and padding, the graph replay protocol, the overlap
bookkeeping, and the arguments we hand the NPU op.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest
import torch

from localradix.backends.cuda.graphs import (
    graph_batch_sizes,
    pad_decode_batch,
    select_batch_size,
)
from localradix.config import ServerArgs
from localradix.model_api.kv_layout import KVLayout
from localradix.sampling_params import SamplingParams
from localradix.sched.sched_config import SchedulerConfig
from localradix.step import ForwardBatch, SamplingBatch

from .conftest import VOCAB
from .gpu_fakes import FakeFlashInfer, FakeGraphApi, FakeTorchNpu, PagedSlots

HEADS, KV_HEADS, DIM = 4, 2, 16


def _prompt(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, VOCAB, n).tolist()


@pytest.fixture
def fake_flashinfer(monkeypatch):
    from localradix.backends.cuda.attention import FlashInferAttention

    fake = FakeFlashInfer()
    monkeypatch.setitem(sys.modules, "flashinfer", fake.module())
    monkeypatch.setattr(FlashInferAttention, "workspace_bytes", 1024)  # the fake needs none
    return fake


# ---- page table -> FlashInfer index arrays -------------------------------------------------


def test_page_size_one_is_the_slot_table():
    from localradix.backends.cuda.attention import paged_kv

    slots = PagedSlots(64, 1, seed=1)
    batch = slots.batch({"a": [1, 2, 3], "b": [4]})
    kv = paged_kv(batch, 1)
    assert kv.kv_indices.dtype == np.int32
    np.testing.assert_array_equal(kv.kv_indices, batch.kv_indices)
    np.testing.assert_array_equal(kv.kv_indptr, batch.kv_indptr)
    np.testing.assert_array_equal(kv.last_page_len, [1, 1])
    np.testing.assert_array_equal(kv.qo_indptr, batch.qo_indptr)


@pytest.mark.parametrize("page_size", [2, 4, 16])
def test_pages_rebuild_every_slot(page_size):
    from localradix.backends.cuda.attention import paged_kv

    rng = np.random.default_rng(page_size)
    slots = PagedSlots(400, page_size, seed=page_size)
    for step in range(6):
        new = {f"r{i}": [7] * int(rng.integers(1, 3 * page_size)) for i in range(step % 3 + 1)}
        batch = slots.batch(new)
        kv = paged_kv(batch, page_size)
        for i in range(batch.num_reqs):
            pages = kv.kv_indices[kv.kv_indptr[i] : kv.kv_indptr[i + 1]]
            rebuilt = (pages[:, None] * page_size + np.arange(page_size)).ravel()
            n = (len(pages) - 1) * page_size + kv.last_page_len[i]
            want = batch.kv_indices[batch.kv_indptr[i] : batch.kv_indptr[i + 1]]
            np.testing.assert_array_equal(rebuilt[:n], want)
            assert 1 <= kv.last_page_len[i] <= page_size


def test_misaligned_slots_are_refused():
    from localradix.backends.cuda.attention import paged_kv

    batch = ForwardBatch.build([np.array([1, 2, 3])], [np.array([8, 9, 11])], [0])
    with pytest.raises(ValueError, match="whole pages of 4"):
        paged_kv(batch, 4)
    shifted = ForwardBatch.build([np.array([1, 2])], [np.array([9, 10])], [0])
    with pytest.raises(ValueError, match="whole pages"):
        paged_kv(shifted, 4)


# ---- graph buckets and padding -------------------------------------------------------------


def test_graph_batch_sizes_cover_the_running_limit():
    assert graph_batch_sizes(64) == (1, 2, 4, 8, 16, 24, 32, 48, 64)
    assert graph_batch_sizes(128)[-3:] == (64, 96, 128)
    assert graph_batch_sizes(100)[-2:] == (96, 100)
    assert graph_batch_sizes(1) == (1,)
    assert graph_batch_sizes(0) == ()
    assert graph_batch_sizes(5000)[-1] == 256


def test_select_batch_size_takes_the_smallest_that_fits():
    sizes = graph_batch_sizes(64)
    assert [select_batch_size(n, sizes) for n in (1, 2, 3, 5, 17, 33, 64)] == [
        1,
        2,
        4,
        8,
        24,
        48,
        64,
    ]
    assert select_batch_size(65, sizes) is None


def test_padding_adds_dummy_requests_on_slot_zero():
    from localradix.backends.cuda.attention import paged_kv

    slots = PagedSlots(64, 4, seed=3)
    slots.batch({"a": [1, 2, 3, 4, 5], "b": [6, 7]})
    batch = slots.batch({"a": [8], "b": [9]})
    padded = pad_decode_batch(batch, 4)
    assert padded.num_reqs == 4 and padded.is_decode_only
    np.testing.assert_array_equal(padded.input_ids, [8, 9, 0, 0])
    np.testing.assert_array_equal(padded.out_slots[2:], [0, 0])
    np.testing.assert_array_equal(padded.positions[2:], [0, 0])
    np.testing.assert_array_equal(padded.kv_indices[: len(batch.kv_indices)], batch.kv_indices)
    kv = paged_kv(padded, 4)
    np.testing.assert_array_equal(kv.kv_indices[-2:], [0, 0])  # dummy page 0
    np.testing.assert_array_equal(kv.last_page_len[-2:], [1, 1])
    assert pad_decode_batch(batch, 2) is batch
    with pytest.raises(ValueError):
        pad_decode_batch(slots.batch({"c": [1, 2]}), 4)


# ---- FlashInfer backend against the torch-native reference --------------------------------


def _attention_pair(page_size: int, num_pages: int = 96):
    from localradix.backends.cuda.attention import FlashInferAttention
    from localradix.runner.attention_torch import TorchNativeAttention

    layout = KVLayout(2, KV_HEADS, DIM, "bfloat16", num_pages * page_size - 1, page_size)
    fi = FlashInferAttention(layout, "cpu", num_heads=HEADS)
    return fi, TorchNativeAttention(layout, "cpu")


def _random_qkv(batch: ForwardBatch, seed: int):
    g = torch.Generator().manual_seed(seed)
    t = batch.num_tokens

    def r(h):
        return torch.randn(t, h, DIM, generator=g).to(torch.bfloat16)

    return r(HEADS), r(KV_HEADS), r(KV_HEADS)


@pytest.mark.parametrize("page_size", [1, 4])
def test_flashinfer_backend_matches_torch_native(fake_flashinfer, page_size):
    fi, ref = _attention_pair(page_size)
    slots = PagedSlots(96, page_size, seed=page_size)
    steps = [
        {"a": list(range(9)), "b": list(range(3))},  # prefill
        {"a": [1], "c": list(range(6)), "b": list(range(4))},  # mixed: decode, new, extend
        {"a": [2], "b": [3], "c": [4]},  # decode only
        {"c": [5]},
    ]
    for i, new in enumerate(steps):
        batch = slots.batch(new)
        fi.prepare(batch)
        ref.prepare(batch)
        for layer in (1, 0):
            q, k, v = _random_qkv(batch, seed=10 * i + layer)
            got = fi.forward(q[:, :], k, v, layer, DIM**-0.5)
            want = ref.forward(q, k, v, layer, DIM**-0.5)
            torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    assert fake_flashinfer.plans["prefill"] == 2 and fake_flashinfer.plans["decode"] == 2


def test_flashinfer_replans_a_wrapper_only_after_its_last_plan_reached_the_device(
    fake_flashinfer, monkeypatch
):
    """FlashInfer reuses one pinned buffer per wrapper for its async plan copy: with overlap,
    planning step N+1 must first wait for the event recorded after step N's plan."""
    from localradix.backends.cuda import attention as attention_flashinfer

    log: list[str] = []

    class Event:
        def __init__(self, name: str) -> None:
            self.name = name

        def synchronize(self) -> None:
            log.append(f"wait {self.name}")

    planned = {"n": 0}

    def event(device):
        planned["n"] += 1
        log.append(f"plan {planned['n']}")
        return Event(str(planned["n"]))

    assert attention_flashinfer.device_event("cpu") is None  # CPU work is never queued
    monkeypatch.setattr(attention_flashinfer, "device_event", event)
    fi, _ = _attention_pair(1)
    slots = PagedSlots(96, 1)
    for new in ({"a": [1, 2, 3]}, {"a": [4]}, {"a": [5]}, {"a": [6, 7]}):
        fi.prepare(slots.batch(new))
    # prefill (1), decode (2), decode waits for 2 then plans (3), prefill waits for 1 (4)
    assert log == ["plan 1", "plan 2", "wait 2", "plan 3", "wait 1", "plan 4"]


def test_flashinfer_backend_refuses_fp32_and_foreign_scale(fake_flashinfer):
    from localradix.backends.cuda.attention import FlashInferAttention

    with pytest.raises(ValueError, match="float16 or bfloat16"):
        FlashInferAttention(KVLayout(1, 1, DIM, "float32", 16), "cpu", num_heads=1)
    fi, _ = _attention_pair(1)
    batch = PagedSlots(96, 1).batch({"a": [1, 2]})
    fi.prepare(batch)
    q, k, v = _random_qkv(batch, 0)
    with pytest.raises(ValueError, match="softmax scale"):
        fi.forward(q, k, v, 0, 0.5)


# ---- the device runner: FlashInfer + decode graphs vs the reference runner -----------------


def _reference_logits(model, attn, batch: ForwardBatch) -> torch.Tensor:
    def t(array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(model.device)

    attn.prepare(batch)
    with torch.inference_mode():
        hidden = model.forward(t(batch.input_ids), t(batch.positions), attn)
        return model.compute_logits(hidden[t(batch.last_token_index)]).float()


# Steps over graphs captured for 4, 2 and 1 requests: prefill, padded and exact decodes, mixed.
GRAPH_STEPS = [
    {"a": _prompt(11, 1), "b": _prompt(5, 2), "c": _prompt(7, 3)},
    {"a": [5], "b": [6], "c": [7]},  # 3 decodes: graph of 4, one dummy
    {"a": [8], "c": [9]},  # graph of 2
    {"b": [10], "d": _prompt(6, 4)},  # a prefill with a decode: eager
    {"a": [11], "b": [12], "c": [13], "d": [14]},
    {"c": [15]},
]


@pytest.fixture(scope="module")
def tiny_bf16(tiny_model):
    from localradix.loader import load_model

    folder, _ = tiny_model("llama")
    return load_model(str(folder), "bfloat16", "cpu")


@pytest.mark.parametrize("page_size", [1, 4])
def test_device_runner_graphs_match_reference(fake_flashinfer, tiny_bf16, page_size):
    from localradix.backends.cuda.runner import DeviceRunner
    from localradix.runner.attention_torch import TorchNativeAttention

    model, config = tiny_bf16
    args = ServerArgs(max_total_tokens=256 * page_size - 1, page_size=page_size)
    args = args.replace(max_running_requests=4, context_length=128)
    api = FakeGraphApi(fake_flashinfer)
    runner = DeviceRunner(model, config, args, "cpu", torch.bfloat16, "flashinfer", graph_api=api)
    assert api.captured == [4, 2, 1]  # largest first
    ref = TorchNativeAttention.from_model_config(config, runner.kv_capacity, torch.bfloat16, "cpu")
    slots = PagedSlots(256, page_size, seed=5)
    for new in GRAPH_STEPS:
        batch = slots.batch(new)
        got = runner.logits(batch)
        want = _reference_logits(model, ref, batch)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=0.05 * float(want.abs().max()), rtol=0)
        assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.75
    assert api.replays == 4
    assert fake_flashinfer.runs["graph"] > 0 and fake_flashinfer.plans["prefill"] == 2
    sampled = runner.forward(slots.batch({"a": [1]}), _greedy(1))
    assert sampled.token_ids.dtype == np.int64 and sampled.token_ids.shape == (1,)
    # An embedding request's one-token step runs eagerly: a graph keeps no hidden states.
    pooling = dataclasses.replace(slots.batch({"b": [2]}), pooling=("last",))
    pooled = runner.forward(pooling, _greedy(1)).pooled
    assert api.replays == 5 and pooled is not None and pooled.shape == (1, config.hidden_size)


def _mixed_sampling(n: int, step: int, logprobs: int | None = None) -> SamplingBatch:
    """Greedy, seeded random and filtered rows whose parameters change every step."""
    rng = np.random.default_rng(step)
    kinds = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.5 + step / 4, seed=step),
        SamplingParams(temperature=1.0, top_p=0.5 + step / 20, top_k=3 + step, min_p=0.02),
        SamplingParams(temperature=2.0 - step / 5),
    ]
    params = [kinds[(i + step) % 4].replace(logprobs=logprobs) for i in range(n)]
    return SamplingBatch.build(params, rng.random(n), [None] * n)


@pytest.mark.parametrize("page_size", [1, 4])
def test_sampling_inside_the_graph_equals_eager_sampling(fake_flashinfer, tiny_bf16, page_size):
    """A graph-run decode step samples inside the graph (fixed parameter buffers refilled per
    replay) and gets exactly the tokens the eager sampler picks from the same logits; a step
    that asks for logprobs is sampled eagerly after the replay."""
    from localradix.backends.cuda.runner import DeviceRunner
    from localradix.runner.sampler import sample

    model, config = tiny_bf16
    args = ServerArgs(max_total_tokens=256 * page_size - 1, page_size=page_size)
    args = args.replace(max_running_requests=4, context_length=128)
    api = FakeGraphApi(fake_flashinfer)
    runner = DeviceRunner(model, config, args, "cpu", torch.bfloat16, "flashinfer", graph_api=api)
    assert runner.graphs is not None
    slots = PagedSlots(256, page_size, seed=5)
    for step, new in enumerate(GRAPH_STEPS):
        batch = slots.batch(new)
        sb = _mixed_sampling(batch.num_reqs, step)
        got = runner.sample_step(batch, sb).token_ids.clone()  # the next replay rewrites it
        assert got.shape == (batch.num_reqs,)  # padding rows never come back
        want = sample(runner.logits(batch), sb).token_ids  # same step again, sampled eagerly
        np.testing.assert_array_equal(got.numpy(), want)
    counts = runner.graphs.counts
    assert counts["sampled_in_graph"] == 4 and counts["sampled_eagerly"] == 0
    batch = slots.batch({"a": [3], "b": [4], "c": [5]})
    sb = _mixed_sampling(3, 9, logprobs=2)
    out = runner.sample_step(batch, sb)
    assert counts["sampled_eagerly"] == 1 and out.top_ids is not None
    want = sample(runner.logits(batch), sb)
    np.testing.assert_array_equal(out.token_ids.numpy(), want.token_ids)
    # `forward` hands back a copy: the next replay rewrites the graph's id buffer.
    first = runner.forward(slots.batch({"a": [1], "b": [2], "c": [3]}), _mixed_sampling(3, 1))
    kept = first.token_ids.copy()
    second = runner.forward(slots.batch({"a": [4], "b": [5], "c": [6]}), _mixed_sampling(3, 2))
    assert not np.array_equal(second.token_ids, kept)
    np.testing.assert_array_equal(first.token_ids, kept)


def test_overlapped_graph_sampling_matches_sync(fake_flashinfer, tiny_fp16):
    """Overlapped steps over graphs that sample inside: the ring and the host copies take
    the graph's fixed id buffer before the next replay rewrites it."""
    from localradix.backends.cuda.runner import DeviceRunner
    from localradix.runner.overlap import OverlapRunner

    model, config = tiny_fp16
    args = ServerArgs(max_total_tokens=511, max_running_requests=4, context_length=128)
    prompts = {"a": _prompt(6, 1), "b": _prompt(9, 2), "c": _prompt(4, 3)}

    def run(overlapped: bool) -> tuple[list[list[int]], dict[str, int]]:
        api = FakeGraphApi(fake_flashinfer)
        base = DeviceRunner(model, config, args, "cpu", torch.float16, "flashinfer", graph_api=api)
        runner = OverlapRunner(base, capacity=64)
        slots, seqs = PagedSlots(512, 1), []
        pending = runner.launch(slots.batch(prompts), _mixed_sampling(3, 0))
        for step in range(1, 6):
            if overlapped:
                new = {n: [int(p)] for n, p in zip(prompts, pending.placeholders)}
                nxt = runner.launch(slots.batch(new), _mixed_sampling(3, step))
                seqs.append(pending.result().token_ids.tolist())
            else:
                out = pending.result()
                seqs.append(out.token_ids.tolist())
                new = {n: [int(t)] for n, t in zip(prompts, out.token_ids)}
                nxt = runner.launch(slots.batch(new), _mixed_sampling(3, step))
            pending = nxt
        assert base.graphs is not None
        return seqs + [pending.result().token_ids.tolist()], dict(base.graphs.counts)

    (overlapped, counts), (sync, _) = run(True), run(False)
    assert overlapped == sync and counts["sampled_in_graph"] == 5


class ReplayingGraphApi:
    """A stand-in for CUDA graphs that checks what a real replay relies on: each replay
    re-runs the captured step reading the very buffers it was captured with."""

    def __init__(self, attn) -> None:
        self.attn, self.captured, self.replays = attn, [], 0

    def _buffers(self) -> tuple[int, ...]:
        attn = self.attn
        held = (attn._out_slots, attn._kv_indptr, attn._kv_indices, attn._seq_lens)
        return tuple(t.data_ptr() for t in held)

    def capture(self, fn):
        out = fn()
        self.captured.append(out.shape[0])
        read = self._buffers()

        def replay() -> None:
            assert self._buffers() == read, "a replay must read the captured buffers"
            out.copy_(fn())
            self.replays += 1

        return replay, out


@pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning")
@pytest.mark.parametrize("page_size", [1, 16])
def test_device_runner_triton_graphs_match_reference(tiny_model, page_size):
    """Decode graphs over the Triton kernels (run by Triton's CPU interpreter): padded batch
    sizes, fixed buffers refilled per replay; logits equal the torch-native reference's."""
    pytest.importorskip("triton")
    from localradix.backends.cuda.runner import DeviceRunner
    from localradix.loader import load_model
    from localradix.runner.attention_torch import TorchNativeAttention

    folder, _ = tiny_model("llama")
    model, config = load_model(str(folder), "float32", "cpu")
    args = ServerArgs(max_total_tokens=64 * page_size - 1, page_size=page_size)
    args = args.replace(max_running_requests=4, context_length=128)
    runner = DeviceRunner(model, config, args, "cpu", torch.float32, "triton", graphs=False)
    api = ReplayingGraphApi(runner.attn)
    runner.graphs = runner._capture_graphs(args, api)
    assert api.captured == [4, 2, 1] and runner.graphs is not None
    ref = TorchNativeAttention.from_model_config(config, runner.kv_capacity, torch.float32, "cpu")
    slots = PagedSlots(64, page_size, seed=5)
    for new in GRAPH_STEPS:
        batch = slots.batch(new)
        got = runner.logits(batch)
        want = _reference_logits(model, ref, batch)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert api.replays == 4


def test_device_runner_without_graphs_or_flashinfer(tiny_model):
    from localradix.backends.cuda.runner import DeviceRunner
    from localradix.loader import load_model

    folder, _ = tiny_model("llama")
    model, config = load_model(str(folder), "float32", "cpu")
    args = ServerArgs(max_total_tokens=300)
    runner = DeviceRunner(model, config, args, "cpu", torch.float32, "torch_native")
    assert runner.graphs is None and runner.kv_capacity == 300
    out = runner.forward(PagedSlots(300, 1).batch({"a": _prompt(5, 0)}), _greedy(1))
    assert out.token_ids.shape == (1,)


# ---- choosing kernels and sizing the pool --------------------------------------------------


def test_attention_choices():
    from localradix.backends.cuda.runner import choose_attention
    from localradix.backends.npu.runner import npu_attention
    from localradix.backends.rocm.runner import rocm_attention
    from localradix.runner.torch_runner import kv_tokens_from_memory

    assert choose_attention("flashinfer", "bfloat16", True)[0] == "flashinfer"
    assert choose_attention("flashinfer", "float32", True) == (
        "torch_native",
        "FlashInfer has no float32 kernels",
    )
    assert "not installed" in choose_attention("flashinfer", "bfloat16", False)[1]
    assert choose_attention("torch_native", "bfloat16", True)[0] == "torch_native"
    # Triton where FlashInfer cannot run, when it is installed (it ships with torch's GPU builds)
    assert choose_attention("flashinfer", "bfloat16", False, triton_ok=True)[0] == "triton"
    assert choose_attention("flashinfer", "float32", True, triton_ok=True) == (
        "triton",
        "Triton paged attention (FlashInfer has no float32 kernels)",
    )
    assert choose_attention("flashinfer", "bfloat16", True, triton_ok=True)[0] == "flashinfer"
    assert choose_attention("torch_native", "bfloat16", False, triton_ok=True)[0] == "torch_native"
    assert rocm_attention("gfx942:sramecc+:xnack-", "bfloat16", True)[0] == "flashinfer"
    assert rocm_attention("gfx950", "float16", True)[0] == "flashinfer"
    assert rocm_attention("gfx1100", "bfloat16", True) == (
        "torch_native",
        "FlashInfer+ROCm does not support gfx1100",
    )
    assert rocm_attention("gfx942", "bfloat16", False)[0] == "torch_native"
    assert npu_attention("bfloat16")[0] == "npu_fused"
    assert npu_attention("float32")[0] == "torch_native"
    assert kv_tokens_from_memory(80 * 2**30, 0.5, 2**17) == 40 * 2**30 // 2**17
    assert kv_tokens_from_memory(10, 0.5, 2**17) == 1024


def test_specs_name_their_runners():
    from localradix import platform as lp
    from localradix.model_api.attention import ATTENTION_BACKENDS
    from localradix.registry import load_object

    specs = lp.backend_specs()
    assert specs["cuda"].supports_graphs and specs["npu"].attention_backend == "npu_fused"
    for name in ("cuda", "rocm", "npu"):
        assert callable(load_object(specs[name].create_runner_fn))
        # each backend registers its own attention kernels when its spec loads
        assert specs[name].attention_backend in ATTENTION_BACKENDS


# ---- overlap: step N+1 launched before step N's results are read ---------------------------


def _greedy(n: int, logprobs: int | None = None) -> SamplingBatch:
    params = [SamplingParams(temperature=0.0, logprobs=logprobs)] * n
    return SamplingBatch.build(params, np.zeros(n), [None] * n)


class _CountingRunner:
    """Logits that pick (token * 7 + position + 1) % V; records the ids it was given."""

    kv_capacity = 1000
    device = "cpu"

    def __init__(self) -> None:
        self.seen: list[list[int]] = []

    def logits(self, batch: ForwardBatch, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        ids = torch.from_numpy(batch.input_ids) if input_ids is None else input_ids
        self.seen.append(ids.tolist())
        last = torch.from_numpy(batch.last_token_index)
        nxt = (ids[last] * 7 + torch.from_numpy(batch.positions)[last] + 1) % VOCAB
        return torch.nn.functional.one_hot(nxt, VOCAB).float()


class _Event:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        self.log.append("sync")


def test_future_tokens_ring_wraps():
    from localradix.runner.overlap import FutureTokens, resolve_placeholders

    ring = FutureTokens(5)
    np.testing.assert_array_equal(ring.reserve(3), [0, 1, 2])
    np.testing.assert_array_equal(ring.reserve(3), [3, 4, 0])
    np.testing.assert_array_equal(FutureTokens.placeholders(np.array([0, 4])), [-1, -5])
    with pytest.raises(ValueError):
        ring.reserve(6)
    values = torch.tensor([10, 11, 12, 13, 14])
    ids = torch.tensor([5, -1, 7, -5, -3])
    assert resolve_placeholders(ids, values).tolist() == [5, 10, 7, 14, 12]


def _sync_sequences(prompts: dict[str, list[int]], steps: int) -> dict[str, list[int]]:
    runner = _CountingRunner()
    slots = PagedSlots(500, 1)
    out = {name: [] for name in prompts}
    new = dict(prompts)
    for _ in range(steps):
        logits = runner.logits(slots.batch(new))
        tokens = logits.argmax(-1).tolist()
        for name, token in zip(new, tokens):
            out[name].append(token)
        new = {name: [token] for name, token in zip(new, tokens)}
    return out


def test_overlap_runner_resolves_placeholders_on_device():
    from localradix.runner.overlap import HostCopies, OverlapRunner

    prompts = {"a": [3, 4, 5], "b": [6], "c": [7, 8]}
    want = _sync_sequences(prompts, steps=8)
    log: list[str] = []

    class Copies(HostCopies):
        def event(self):
            log.append("launch")
            return _Event(log)

    runner = _CountingRunner()
    overlap = OverlapRunner(runner, capacity=7, copies=Copies("cpu"))  # wraps every 2-3 steps
    slots = PagedSlots(500, 1)
    got = {name: [] for name in prompts}
    pending = overlap.launch(slots.batch(prompts), _greedy(3))
    for _ in range(7):
        # The host schedules N+1 with N's placeholders, launches it, then reads N's results.
        new = {name: [int(p)] for name, p in zip(prompts, pending.placeholders)}
        assert all(p[0] < 0 for p in new.values())
        following = overlap.launch(slots.batch(new), _greedy(3))
        for name, token in zip(prompts, pending.result().token_ids):
            got[name].append(int(token))
        pending = following
    for name, token in zip(prompts, pending.result().token_ids):
        got[name].append(int(token))
    assert got == want
    assert all(min(ids) >= 0 for ids in runner.seen)  # the model never saw a placeholder
    assert log[:3] == ["launch", "launch", "sync"]  # N+1 launched before N was waited on


def test_overlap_with_the_device_runner_matches_sync(tiny_model):
    from localradix.backends.cuda.runner import DeviceRunner
    from localradix.loader import load_model
    from localradix.runner.overlap import OverlapRunner

    folder, _ = tiny_model("llama")
    model, config = load_model(str(folder), "float32", "cpu")
    args = ServerArgs(max_total_tokens=400)
    prompts = {"a": _prompt(6, 1), "b": _prompt(9, 2)}

    def run(overlapped: bool) -> list[list[int]]:
        base = DeviceRunner(model, config, args, "cpu", torch.float32, "torch_native")
        runner = OverlapRunner(base, capacity=64)
        slots, seqs = PagedSlots(400, 1), []
        pending = runner.launch(slots.batch(prompts), _greedy(2, logprobs=2))
        for _ in range(5):
            if overlapped:
                new = {n: [int(p)] for n, p in zip(prompts, pending.placeholders)}
                nxt = runner.launch(slots.batch(new), _greedy(2, logprobs=2))
                seqs.append(pending.result().token_ids.tolist())
            else:
                out = pending.result()
                seqs.append(out.token_ids.tolist())
                new = {n: [int(t)] for n, t in zip(prompts, out.token_ids)}
                nxt = runner.launch(slots.batch(new), _greedy(2, logprobs=2))
            pending = nxt
        final = pending.result()
        assert final.top_ids is not None and final.top_ids.shape == (2, 2)
        return seqs + [final.token_ids.tolist()]

    assert run(True) == run(False)


def test_sample_on_device_equals_the_sampler():
    from localradix.runner.overlap import sample_on_device
    from localradix.runner.sampler import sample

    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    params = [
        SamplingParams(temperature=0.0, logprobs=3),
        SamplingParams(temperature=0.8, top_p=0.9, logprobs=3),
        SamplingParams(temperature=1.2, top_k=5, logprobs=3),
    ]
    sb = SamplingBatch.build(params, np.array([0.3, 0.6, 0.9]), [None] * 3)
    want = sample(logits, sb)
    got = sample_on_device(logits, sb)
    np.testing.assert_array_equal(got.token_ids.numpy(), want.token_ids)
    np.testing.assert_allclose(got.logprobs.numpy(), want.logprobs)
    np.testing.assert_array_equal(got.top_ids.numpy(), want.top_ids)


# ---- Ascend: the fused op's arguments ------------------------------------------------------


def _npu_pair(monkeypatch, page_size: int, fake: FakeTorchNpu):
    monkeypatch.setitem(sys.modules, "torch_npu", fake.module())
    from localradix.backends.npu.attention import NpuFusedAttention
    from localradix.runner.attention_torch import TorchNativeAttention

    layout = KVLayout(2, KV_HEADS, DIM, "bfloat16", 64 * page_size - 1, page_size)
    npu = NpuFusedAttention(layout, "cpu", num_heads=HEADS)
    return npu, TorchNativeAttention(layout, "cpu")


@pytest.mark.parametrize(("page_size", "layout"), [(1, "BSND"), (4, "BSND"), (16, "BSH")])
def test_npu_fused_decode_matches_torch_native(monkeypatch, page_size, layout):
    fake = FakeTorchNpu()
    npu, ref = _npu_pair(monkeypatch, page_size, fake)
    slots = PagedSlots(64, page_size, seed=2)
    for i, new in enumerate(
        [{"a": list(range(20)), "b": list(range(3))}, {"a": [1], "b": [2]}, {"b": [3]}]
    ):
        batch = slots.batch(new)
        npu.prepare(batch)
        ref.prepare(batch)
        for layer in (0, 1):
            q, k, v = _random_qkv(batch, seed=i * 10 + layer)
            got = npu.forward(q, k, v, layer, DIM**-0.5)
            want = ref.forward(q, k, v, layer, DIM**-0.5)
            torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    assert fake.calls == [layout] * 4  # decode steps only; the prefill ran torch-native


def test_npu_older_scale_keyword_and_broken_op(monkeypatch, caplog):
    old = FakeTorchNpu(scale_name="scale_value")
    npu, _ = _npu_pair(monkeypatch, 1, old)
    slots = PagedSlots(64, 1)
    slots.batch({"a": [1, 2, 3]})
    batch = slots.batch({"a": [4]})
    npu.prepare(batch)
    npu.forward(*_random_qkv(batch, 0), 0, DIM**-0.5)
    assert old.calls == ["BSND"] and npu._scale_kw == "scale_value"

    broken = FakeTorchNpu(broken=True)
    npu, ref = _npu_pair(monkeypatch, 1, broken)
    npu.prepare(batch)
    ref.prepare(batch)
    q, k, v = _random_qkv(batch, 1)
    got = npu.forward(q, k, v, 0, DIM**-0.5)
    torch.testing.assert_close(got, ref.forward(q, k, v, 0, DIM**-0.5))
    assert not npu.fused and "using torch-native" in caplog.text


# ---- the scheduler over the device runner (page sizes > 1, cached prefixes, chunks) --------


def _serve(runner, args: ServerArgs, prompts: list[list[int]], config) -> list[list[int]]:
    from localradix.messages import GenerateRequest
    from localradix.sched.scheduler import Scheduler

    sched = Scheduler(
        runner,
        SchedulerConfig.from_args(args),
        context_len=256,
        eos_token_ids=(),
        decode=lambda ids: "",
        vocab_size=config.vocab_size,
    )
    params = SamplingParams(temperature=0.0, max_new_tokens=6, ignore_eos=True)
    tokens: dict[str, list[int]] = {}
    for round_ in range(2):  # the second round is served from the radix cache
        for i, p in enumerate(prompts):
            sched.add_request(GenerateRequest(f"{round_}-{i}", tuple(p), params))
        while sched.has_work():
            for out in sched.step():
                tokens.setdefault(out.rid, []).extend(out.new_token_ids)
    sched.check_invariants(idle=True)
    return [tokens[rid] for rid in sorted(tokens)]


@pytest.fixture(scope="module")
def tiny_fp16(tiny_model):
    from localradix.loader import load_model

    folder, _ = tiny_model("llama")
    return load_model(str(folder), "float16", "cpu")


@pytest.mark.parametrize("page_size", [1, 4])
def test_scheduler_drives_flashinfer_and_graphs(fake_flashinfer, tiny_fp16, page_size):
    """Same tokens as torch-native attention (fp16: bf16 rounding makes near-ties flip)."""
    from localradix.backends.cuda.runner import DeviceRunner

    model, config = tiny_fp16
    args = ServerArgs(max_total_tokens=1023, page_size=page_size, chunked_prefill_size=8)
    args = args.replace(max_running_requests=4, context_length=256)
    shared = _prompt(13, 7)
    prompts = [shared + _prompt(4, 8), shared + _prompt(9, 9), _prompt(3, 10), _prompt(20, 11)]
    api = FakeGraphApi(fake_flashinfer)
    fi = DeviceRunner(model, config, args, "cpu", torch.float16, "flashinfer", graph_api=api)
    native = DeviceRunner(model, config, args, "cpu", torch.float16, "torch_native")
    assert _serve(fi, args, prompts, config) == _serve(native, args, prompts, config)
    assert api.replays > 0 and fake_flashinfer.plans["prefill"] > 0


def test_failed_capture_falls_back_to_eager(fake_flashinfer, tiny_fp16, caplog):
    from localradix.backends.cuda.runner import DeviceRunner

    class Broken:
        def capture(self, fn):
            raise RuntimeError("operation not permitted when stream is capturing")

    model, config = tiny_fp16
    args = ServerArgs(max_total_tokens=255, max_running_requests=2, context_length=64)
    runner = DeviceRunner(
        model, config, args, "cpu", torch.float16, "flashinfer", graph_api=Broken()
    )
    assert runner.graphs is None and "decode runs eagerly" in caplog.text
    slots = PagedSlots(256, 1)
    runner.logits(slots.batch({"a": _prompt(4, 0)}))
    assert runner.logits(slots.batch({"a": [3]})).shape == (1, VOCAB)
