"""The torch-native attention backend against a naive per-request reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from localradix.model_api.attention import (
    ATTENTION_BACKENDS,
    AttentionBackend,
    get_attention_backend,
)
from localradix.model_api.kv_layout import KVLayout
from localradix.step import ForwardBatch

HQ, HKV, D = 6, 2, 8


def _naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int) -> torch.Tensor:
    """q [E, Hq, D], k/v [S, Hkv, D] (whole sequence) -> [E, Hq * D], causal from `prefix`."""
    k = k.repeat_interleave(HQ // HKV, dim=1)
    v = v.repeat_interleave(HQ // HKV, dim=1)
    scores = torch.einsum("ehd,shd->hes", q, k) / math.sqrt(D)
    e, s = q.shape[0], k.shape[0]
    allowed = torch.arange(s)[None, :] <= prefix + torch.arange(e)[:, None]
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hes,shd->ehd", scores.softmax(-1), v).reshape(e, HQ * D)


class _World:
    """Whole-sequence K/V per request, fed to the backend in steps, checked every step."""

    def __init__(self, num_slots: int = 256, contiguous: bool = False) -> None:
        self.attn = get_attention_backend("torch_native")(
            KVLayout(1, HKV, D, "float32", num_slots), "cpu"
        )
        slots = np.arange(1, num_slots + 1)
        self.free = list(slots[::-1] if contiguous else np.random.default_rng(0).permutation(slots))
        self.k: dict[str, torch.Tensor] = {}
        self.v: dict[str, torch.Tensor] = {}
        self.tables: dict[str, list[int]] = {}
        self.gen = torch.Generator().manual_seed(0)

    def fork(self, name: str, parent: str, n: int) -> None:
        """A new request whose first n tokens are `parent`'s, on the same slots (a cache hit)."""
        self.tables[name] = self.tables[parent][:n]
        self.k[name], self.v[name] = self.k[parent][:n], self.v[parent][:n]

    def step(self, extends: dict[str, int]) -> None:
        qs, ks, vs, tables, prefixes, ids = [], [], [], [], [], []
        for name, n in extends.items():
            table = self.tables.setdefault(name, [])
            prefixes.append(len(table))
            table += [int(self.free.pop()) for _ in range(n)]
            tables.append(np.array(table))
            ids.append(np.zeros(n, dtype=np.int64))
            q, k, v = (torch.randn(n, h, D, generator=self.gen) for h in (HQ, HKV, HKV))
            qs.append(q)
            ks.append(k)
            vs.append(v)
            self.k[name] = torch.cat([self.k.get(name, k[:0]), k])
            self.v[name] = torch.cat([self.v.get(name, v[:0]), v])
        batch = ForwardBatch.build(ids, tables, prefixes)
        self.attn.prepare(batch)
        out = self.attn.forward(torch.cat(qs), torch.cat(ks), torch.cat(vs), 0, D**-0.5)
        assert out.shape == (batch.num_tokens, HQ * D)
        for i, name in enumerate(extends):
            rows = slice(batch.qo_indptr[i], batch.qo_indptr[i + 1])
            expected = _naive(qs[i], self.k[name], self.v[name], prefixes[i])
            torch.testing.assert_close(out[rows], expected, atol=1e-5, rtol=1e-5)
        assert torch.all(self.attn.k_cache[0, 0] == 0), "the dummy slot must stay untouched"


def test_prefill_then_decode_single_request():
    world = _World()
    world.step({"a": 9})
    for _ in range(4):
        world.step({"a": 1})


@pytest.mark.parametrize("contiguous", [False, True])
def test_decodes_sharing_a_prefix_read_it_once_and_match(monkeypatch, contiguous):
    """Cascade decode: each group's shared slots attended once, merged with each request's own."""
    from localradix.runner import attention_torch

    groups: list[int] = []
    cascade = attention_torch._cascade

    def spy(plan, *args):
        groups.append(len(plan.shared))
        return cascade(plan, *args)

    monkeypatch.setattr(attention_torch, "_cascade", spy)
    world = _World(num_slots=512, contiguous=contiguous)
    world.step({"a": 70, "x": 80})
    world.fork("b", "a", 70)
    world.fork("c", "a", 66)
    world.fork("d", "x", 75)
    world.fork("e", "x", 10)  # shares too little to be worth a group of its own
    world.step({"b": 3, "c": 5, "d": 2, "e": 4})
    assert groups == []  # extends never cascade
    for _ in range(3):
        world.step({"a": 1, "b": 1, "c": 1, "x": 1, "d": 1, "e": 1})
    assert groups == [2, 2, 2]  # {a, b, c} on 66 slots, {x, d} on 75; e attends alone


def test_contiguous_single_decode_uses_a_view_and_is_correct():
    world = _World(contiguous=True)
    world.step({"a": 5})
    world.step({"a": 1})
    assert isinstance(world.attn._decodes[0].slots, slice)
    world.step({"a": 3})  # extend with a prefix
    world.step({"a": 1})


def test_short_extends_over_a_prefix_attend_grouped_and_long_ones_through_sdpa(monkeypatch):
    """A verify step (k + 1 rows), a short turn over a cached prefix or a lone decode: one
    matmul per KV head, no K/V repeat; a longer extend keeps SDPA. All match the reference."""
    from localradix.runner import attention_torch

    rows: list[int] = []
    grouped = attention_torch._grouped

    def spy(q, *args, **kwargs):
        rows.append(q.shape[0])
        return grouped(q, *args, **kwargs)

    monkeypatch.setattr(attention_torch, "_grouped", spy)
    world = _World(num_slots=512)
    world.step({"a": 40})
    world.step({"a": attention_torch.SMALL_EXTEND})
    world.step({"a": attention_torch.SMALL_EXTEND + 1})
    world.step({"a": 1})
    assert rows == [attention_torch.SMALL_EXTEND, 1]  # and a lone decode (scattered slots)


def test_mixed_batches():
    world = _World()
    world.step({"a": 4, "b": 7, "c": 1})
    world.step({"a": 1, "b": 5, "d": 3, "c": 1})  # decode, extend with prefix, prefill, decode
    world.step({"d": 1, "a": 1, "b": 1, "c": 1})  # decode-only, ragged lengths (padding mask)
    world.step({"e": 2, "d": 1})
    world.step({"a": 6})  # a lone extend with a prefix


def test_decode_batch_of_32_is_one_call():
    world = _World(num_slots=2048)
    world.step({f"r{i}": 3 + i for i in range(32)})
    world.step({f"r{i}": 1 for i in range(32)})
    (plan,) = world.attn._decodes
    assert plan.token_index is None and plan.slots.shape == (32, 3 + 31 + 1)
    assert world.attn._extends == []


def test_big_decode_batches_are_split(monkeypatch):
    world = _World(num_slots=2048)
    world.step({f"r{i}": 3 + i for i in range(12)} | {"x": 4})
    bytes_per_token = 2 * HKV * D * 4
    monkeypatch.setattr(world.attn, "decode_gather_bytes", 4 * 16 * bytes_per_token)
    world.step({f"r{i}": 1 for i in range(12)})  # widest is 15 tokens: 4 requests per call
    assert len(world.attn._decodes) == 3
    world.step({f"r{i}": 1 for i in range(12)} | {"x": 5})  # with an extend mixed in
    assert len(world.attn._decodes) == 3 and len(world.attn._extends) == 1


def test_registry_and_sizing():
    assert "torch_native" in ATTENTION_BACKENDS
    backend = get_attention_backend("torch_native")
    assert issubclass(backend, AttentionBackend)
    with pytest.raises(ValueError, match="unknown attention backend"):
        get_attention_backend("nope")
    assert AttentionBackend.kv_bytes_per_token(30, 3, 64, torch.bfloat16) == 2 * 30 * 3 * 64 * 2
    attn = backend(KVLayout(2, HKV, D, "float32", 10), "cpu")
    assert attn.k_cache.shape == (2, 11, HKV, D)
