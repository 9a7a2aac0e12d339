"""Embedding requests through the in-process Engine on a tiny random-weight Qwen3 embedding
model, against transformers' `Qwen3Model` on the same weights: last-token and mean pooling,
alone, batched with generation, chunked, and served again from the radix cache."""

from __future__ import annotations

import numpy as np
import pytest

from localradix import Engine
from localradix.engine.tracker import EMBED_PARAMS
from localradix.loader.embedding import EmbeddingHead, embedding_head
from localradix.messages import Embed, GenerateRequest
from localradix.sampling_params import SamplingParams
from localradix.store.source import resolve_model

from .conftest import random_prompts, requires_mlx
from .embedding_model import reference_embedding, save_embedding_model

PROMPTS = random_prompts(5, (5, 17, 40, 3))
OTHERS = random_prompts(6, (9, 30, 4, 12))  # generated beside the embeddings


@pytest.fixture(scope="module", params=["last", "mean"])
def model(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"embed-{request.param}")
    hf = save_embedding_model(folder, pooling=request.param, normalize=request.param == "last")
    return folder, hf, request.param


def _refs(model):
    folder, hf, pooling = model
    return [reference_embedding(hf, p, pooling, normalize=pooling == "last") for p in PROMPTS]


def _close(got, want):
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-4, atol=1e-5)


def test_the_loader_reads_the_pooling_files(model):
    folder, _, pooling = model
    assert embedding_head(resolve_model(str(folder))) == EmbeddingHead(pooling, pooling == "last")


def test_alone_batched_and_chunked_match_transformers(model):
    folder, _, pooling = model
    refs = _refs(model)
    with Engine(str(folder), dtype="float32", max_total_tokens=2048) as engine:
        assert engine.info.pooling == pooling
        for prompt, ref in zip(PROMPTS, refs):  # one at a time
            _close(engine.embed(prompt)[0], ref)
        hits = engine.stats().cache_hit_tokens
        _close(engine.embed(PROMPTS), refs)  # batched; every prompt is cached by now
        # A last-token embedding reuses its cached prompt; a mean-pooled one needs every state.
        reused = engine.stats().cache_hit_tokens - hits
        assert reused == (sum(len(p) - 1 for p in PROMPTS) if pooling == "last" else 0)
        engine.check_invariants(idle=True)
    with Engine(
        str(folder),
        dtype="float32",
        max_total_tokens=2048,
        chunked_prefill_size=8,
        overlap_schedule="on",  # chunks pooled while the next step is prepared
    ) as chunked:
        _close(chunked.embed(PROMPTS), refs)
        chunked.check_invariants(idle=True)


@requires_mlx
def test_the_mlx_runner_embeds_as_transformers_does(model):
    folder, _, _ = model
    with Engine(
        str(folder), backend="mlx", dtype="float32", max_total_tokens=2048, chunked_prefill_size=8
    ) as engine:
        _close(engine.embed(PROMPTS), _refs(model))
        _close(engine.embed(PROMPTS), _refs(model))  # cached (last) or not (mean)
        engine.check_invariants(idle=True)


def test_embedding_rows_share_a_step_with_generation(model):
    """Embedding and generating requests admitted together prefill in one forward; each gets
    its own answer (the generated tokens are those of the request alone)."""
    folder, _, pooling = model
    refs = _refs(model)
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)
    embed = Embed(pooling, pooling == "last")

    def together(core):
        for i, (ids, other) in enumerate(zip(PROMPTS, OTHERS)):
            core.add_request(GenerateRequest(f"g{i}", tuple(other), greedy))
            core.add_request(GenerateRequest(f"e{i}", tuple(ids), EMBED_PARAMS, embed=embed))
        first = core.step()  # one prefill batch: every prompt, both kinds
        outputs = list(first)
        while core.has_work():
            outputs += core.step()
        return first, outputs

    with Engine(str(folder), dtype="float32", max_total_tokens=2048) as engine:
        alone = [r.token_ids for r in engine.generate(OTHERS, greedy)]
        engine.flush_cache()
        first, outputs = engine._call(together)
        engine.check_invariants(idle=True)
    assert {o.rid for o in first if o.embedding is not None} == {f"e{i}" for i in range(4)}
    done = {o.rid: o for o in outputs if o.finished}
    _close([done[f"e{i}"].embedding for i in range(4)], refs)
    assert all(done[f"e{i}"].finish_reason == "stop" for i in range(4))
    assert all(done[f"e{i}"].prompt_tokens == len(p) for i, p in enumerate(PROMPTS))
    tokens = {i: [] for i in range(4)}
    for o in outputs:
        if o.rid.startswith("g"):
            tokens[int(o.rid[1:])] += o.new_token_ids
    assert [tokens[i] for i in range(4)] == alone


def test_a_text_prompt_is_tokenized_with_the_eos_the_tokenizer_appends(model):
    folder, hf, pooling = model
    with Engine(str(folder), dtype="float32", max_total_tokens=512) as engine:
        ref = reference_embedding(hf, [7, 8, 9, 1], pooling, normalize=pooling == "last")
        _close(engine.embed("w7 w8 w9")[0], ref)
