"""The cache tiers under tensor parallelism (CPU, gloo, 2 ranks): a token's KV row is every
rank's heads in model order, as a tp=1 runner writes it, so a prefix kept by tp=2 comes back
after a restart bit for bit on every rank, and tp=1 reads the same disk folder."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from localradix import Engine, SamplingParams
from localradix.models.config import ModelConfig
from localradix.runner.kv_transfer import TorchKVTransfer
from localradix.runner.tp.kv_transfer import HeadMap, rank_part, to_canonical

from .conftest import hf_greedy, random_prompts
from .test_kv_tiers_real import shared

pytestmark = pytest.mark.slow  # seconds of e2e work: the full suite runs it, the fast tier does not

NEW = 8
GREEDY = SamplingParams(temperature=0, max_new_tokens=NEW, ignore_eos=True)


def _engine(folder, disk, tp: int = 2, **kw: object) -> Engine:
    tiers = {"kv_disk_cache": str(disk), "kv_disk_gib": 1.0} if disk else {"kv_disk_cache": "off"}
    return Engine(
        str(folder), backend="cpu", dtype="float32", tp=tp, max_total_tokens=1024, **tiers, **kw
    )


@pytest.mark.parametrize("kv_heads, size", [(2, 2), (1, 2), (4, 2), (2, 4)])
def test_rows_are_canonical_for_every_split(tiny_model, kv_heads, size):
    """Each rank's rows of its own heads, gathered, equal a tp=1 runner's rows; the rows cut
    for each rank write back exactly its heads (also where ranks share a replicated head)."""
    folder, _ = tiny_model("llama")
    hf = json.loads((folder / "config.json").read_text())
    config = dataclasses.replace(ModelConfig.from_hf_dict(hf), num_key_value_heads=kv_heads)
    heads = HeadMap.for_model(config, size)
    layers, slots, dim = 2, 9, 16
    torch.manual_seed(0)
    k, v = torch.randn(2, layers, slots + 1, kv_heads, dim).unbind(0)
    full = TorchKVTransfer(k, v)
    local = [TorchKVTransfer(k[:, :, list(h)], v[:, :, list(h)]) for h in heads.ranks]
    picked = np.array([3, 1, 7, 8])
    rows = full.rows(picked)
    assert torch.equal(to_canonical([t.rows(picked) for t in local], heads, layers), rows)
    for rank, h in enumerate(heads.ranks):
        empty = torch.zeros(layers, slots + 1, len(h), dim)
        mine = TorchKVTransfer(empty, torch.zeros_like(empty))
        mine.put_rows(picked, rank_part(rows, heads, rank, layers))
        assert torch.equal(mine.rows(picked), local[rank].rows(picked))
        assert torch.equal(empty[:, picked], k[:, picked][:, :, list(h)])


def test_a_restart_brings_every_ranks_kv_back_and_tp1_shares_it(tiny_model, tmp_path):
    folder, hf = tiny_model("llama")
    prompt = random_prompts(7, lengths=(300,))[0]
    question = prompt + [11, 12, 13]
    with _engine(folder, tmp_path) as e:
        answer = e.generate([prompt], GREEDY)[0].token_ids
        assert answer == hf_greedy(hf, prompt, NEW)
        before, canonical = _kv(e, prompt)
    with _engine(folder, tmp_path) as e:  # a restart: the memory cache starts empty
        warm = e.generate([question], GREEDY)[0]
        assert warm.cached_tokens == shared(prompt + answer[:-1], question[:-1]) == 300
        assert e.stats().kv_tiers["disk_hit_tokens"] >= 256
        after, _ = _kv(e, prompt)
        assert len(after) == 2 and all(np.array_equal(a, b) for a, b in zip(after, before))
        e.check_invariants(idle=True)
    with _engine(folder, None) as e:  # no tiers: computed afresh
        cold = e.generate([question], GREEDY)[0]
        assert cold.cached_tokens == 0
    assert warm.token_ids == cold.token_ids == hf_greedy(hf, question, NEW)
    with _engine(folder, tmp_path, tp=1) as e:  # the same fingerprint: tp=1 reads tp=2's KV
        one = e.generate([question], GREEDY)[0]  # (the restarted tp=2 kept `question` too)
        assert one.cached_tokens == len(question) - 1 and one.token_ids == warm.token_ids
        match = e.core.scheduler.cache.match_prefix(np.array(prompt))
        rows = e.core.runner.kv_transfer.read(match.indices[: len(prompt)])
        assert np.array_equal(rows, canonical)


def _kv(e: Engine, tokens: list[int]) -> tuple[list[np.ndarray], np.ndarray]:
    """Every rank's KV rows of `tokens`' cached slots, and the canonical rows of them."""
    match = e.core.scheduler.cache.match_prefix(np.array(tokens))
    assert match.matched_len >= len(tokens)
    slots = match.indices[: len(tokens)]
    kv = e.core.runner.kv_transfer
    return kv.read_ranks(slots), kv.read(slots)
