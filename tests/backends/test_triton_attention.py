"""The Triton attention kernels under Triton's CPU interpreter, against a float64 reference.

Random paged layouts (page sizes 1 and 16, slots scattered over the cache), mixed request
lengths, GQA groups of 1, 2, 3 and 4 query heads per KV head, head sizes that are and are not
powers of two, decode batches split over several key ranges, extends over a cached prefix
mixed with decodes, sliding windows, logit soft-caps and attention sinks; float32 and float16
(the interpreter's bfloat16 dot is broken).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

from localradix.backends.cuda import triton_attention  # noqa: E402
from localradix.backends.cuda.triton_attention import TritonAttention, decode_splits  # noqa: E402
from localradix.model_api.attention_spec import AttentionSpec  # noqa: E402
from localradix.model_api.kv_layout import KVLayout  # noqa: E402
from localradix.step import ForwardBatch  # noqa: E402

if not triton_attention.interpreter_active():  # tests/conftest.py turns it on without a GPU
    pytest.skip(
        "triton runs compiled here (a GPU): see test_gpu_devices.py", allow_module_level=True
    )

# Triton 3.6's interpreter turns 1-element arrays into scalars, which numpy deprecates.
pytestmark = [
    pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning"),
    pytest.mark.slow,
]
TOL = {torch.float32: 2e-5, torch.float16: 3e-3}


def _batch(
    rng: np.random.Generator, seq_lens: list[int], extend_lens: list[int], slots: int, page: int
) -> ForwardBatch:
    """Each request's slots: whole pages of `page` slots in order, pages scattered."""
    pages = rng.permutation(np.arange(1, slots // page))  # page 0 holds the dummy slot 0
    kv, taken = [], 0
    for n in seq_lens:
        need = -(-n // page)
        own = pages[taken : taken + need]
        taken += need
        kv.append((own[:, None] * page + np.arange(page)[None, :]).reshape(-1)[:n])
    kv_indices = np.concatenate(kv).astype(np.int64)
    seq, ext = np.array(seq_lens), np.array(extend_lens)
    kv_indptr = np.concatenate([[0], np.cumsum(seq)])
    qo_indptr = np.concatenate([[0], np.cumsum(ext)])
    new = [kv[i][seq[i] - ext[i] :] for i in range(len(seq))]
    positions = np.concatenate([np.arange(s - e, s) for s, e in zip(seq, ext)])
    return ForwardBatch(
        input_ids=np.zeros(int(ext.sum()), dtype=np.int64),
        positions=positions.astype(np.int64),
        out_slots=np.concatenate(new).astype(np.int64),
        qo_indptr=qo_indptr.astype(np.int64),
        kv_indptr=kv_indptr.astype(np.int64),
        kv_indices=kv_indices,
        seq_lens=seq.astype(np.int64),
        extend_lens=ext.astype(np.int64),
    )


def _reference(attn, batch, q, layer, scale, window, cap, sinks=None):
    """float64 attention of each new token over its request's keys (positions <= its own);
    `sinks` [Hq]: one more logit per head in the softmax, with no value."""
    k_all = attn.k_cache[layer].double()
    v_all = attn.v_cache[layer].double()
    group = q.shape[1] // attn.num_kv_heads
    out = torch.zeros(q.shape, dtype=torch.float64)
    for i in range(batch.num_reqs):
        slots = torch.from_numpy(batch.kv_indices[batch.kv_indptr[i] : batch.kv_indptr[i + 1]])
        keys = k_all[slots].repeat_interleave(group, 1)  # [S, Hq, D]
        values = v_all[slots].repeat_interleave(group, 1)
        for row in range(batch.qo_indptr[i], batch.qo_indptr[i + 1]):
            pos = int(batch.positions[row])
            s = torch.einsum("hd,shd->hs", q[row].double(), keys) * scale
            if cap:
                s = cap * torch.tanh(s / cap)
            j = torch.arange(len(slots))
            seen = (j <= pos) & ((j > pos - window) if window else True)
            s = s.masked_fill(~seen, float("-inf"))
            if sinks is not None:
                s = torch.cat([s, sinks.double()[:, None]], dim=-1)
            probs = torch.softmax(s, -1)[:, : len(slots)]
            out[row] = torch.einsum("hs,shd->hd", probs, values)
    return out


def _run(seed, seq_lens, extend_lens, *, heads=4, kv_heads=2, dim=16, page=1, dtype=torch.float32,
         window=0, cap=0.0, sinks=False):  # fmt: skip
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    slots = page * (2 * sum(-(-n // page) for n in seq_lens) + 2)  # room to scatter pages
    layout = KVLayout(2, kv_heads, dim, str(dtype).removeprefix("torch."), slots, page)
    attn = TritonAttention(layout, "cpu", AttentionSpec.of((0, window), (0.0, cap), sinks))
    batch = _batch(rng, seq_lens, extend_lens, slots, page)
    for layer in range(2):  # earlier tokens of every request, as a cache would hold them
        attn.k_cache[layer].copy_(torch.randn(attn.k_cache[layer].shape, generator=gen))
        attn.v_cache[layer].copy_(torch.randn(attn.v_cache[layer].shape, generator=gen))
    tokens = batch.num_tokens
    q = torch.randn((tokens, heads, dim), generator=gen).to(dtype)
    k = torch.randn((tokens, kv_heads, dim), generator=gen).to(dtype)
    v = torch.randn((tokens, kv_heads, dim), generator=gen).to(dtype)
    scale = dim**-0.5
    sink = (3 * torch.randn(heads, generator=gen)).to(dtype) if sinks else None
    attn.prepare(batch)
    got = attn.forward(q, k, v, 1, scale, sink).view(tokens, heads, dim)
    assert torch.equal(attn.k_cache[1][torch.from_numpy(batch.out_slots)], k)  # stored first
    want = _reference(attn, batch, q, 1, scale, window, cap, sink)
    err = (got.double() - want).abs().max().item()
    assert err < TOL[dtype], err
    return attn


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (6, 2), (8, 2)])
def test_decode_mixed_lengths(dtype, page, heads, kv_heads):
    _run(1, [1, 7, 40, 97], [1, 1, 1, 1], heads=heads, kv_heads=kv_heads, page=page, dtype=dtype)


def test_decode_over_several_splits(monkeypatch):
    monkeypatch.setattr(triton_attention, "KEYS_PER_SPLIT", 16)
    assert decode_splits(300, 2) == triton_attention.MAX_SPLITS
    _run(2, [300, 33, 2], [1, 1, 1], dim=24)  # some splits of the short ones are empty


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("page", [1, 16])
def test_extend_over_a_prefix_mixed_with_decodes(dtype, page):
    # a fresh prompt, a chunk after a cached prefix, a decode, a speculative verify (k + 1 = 5)
    _run(3, [45, 90, 61, 30], [45, 37, 1, 5], heads=6, kv_heads=2, page=page, dtype=dtype)


@pytest.mark.parametrize("seq_lens, extend_lens", [([50, 9], [1, 1]), ([70, 40], [70, 12])])
def test_sliding_window_and_soft_cap(seq_lens, extend_lens):
    _run(4, seq_lens, extend_lens, window=8, cap=5.0)
    _run(5, seq_lens, extend_lens, window=33)  # a window that starts inside a block


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("window", [0, 8])
def test_attention_sinks(monkeypatch, dtype, window):
    """gpt-oss's sinks: decodes over several splits (the sink joins their merge), and extends
    over a prefix mixed with a decode."""
    monkeypatch.setattr(triton_attention, "KEYS_PER_SPLIT", 16)
    _run(7, [90, 33, 2], [1, 1, 1], dtype=dtype, window=window, sinks=True)
    _run(8, [45, 90, 61], [45, 37, 1], heads=6, kv_heads=2, dtype=dtype, window=window, sinks=True)


def test_head_dim_not_a_power_of_two_and_one_kv_head():
    _run(6, [64, 3], [20, 1], heads=5, kv_heads=1, dim=40)


def test_splits_follow_length_and_occupancy():
    assert decode_splits(1, 1) == 1
    assert decode_splits(100_000, 1) == triton_attention.MAX_SPLITS
    assert decode_splits(100_000, 4096) == 1  # enough programs without splitting
    assert decode_splits(600, 1) == 3
