"""Qwen3.5 text models (gated delta-net linear attention beside gated full attention) on the CPU
backend: logits like transformers' over chunkings, mixed batches and restored states; greedy
through the Engine token for token like transformers alone, batched, with the radix cache on
(a shared system prompt, a multi-turn chat: resumed from state snapshots) and off, chunked,
retracted; snapshots bounded and freed. Qwen3.5-MoE and Qwen3-Next (experts beside a shared
expert; Qwen3-Next's regrouped projections) by logits and greedy. Also config parsing and the
backends' refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine.conftest import VOCAB, _word_level_tokenizer, hf_greedy, random_prompts
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from localradix import Engine, SamplingParams
from localradix.models import ModelConfig
from localradix.step import ForwardBatch

transformers = pytest.importorskip("transformers")

NEW = 12
LAYER_TYPES = ["linear_attention", "full_attention", "linear_attention", "linear_attention"]
LAYER_TYPES += ["full_attention"]


def _hf_config(family: str = "dense", **extra: object):
    make = {
        "dense": transformers.Qwen3_5TextConfig,
        "moe": transformers.Qwen3_5MoeTextConfig,
        "next": transformers.Qwen3NextConfig,
    }[family]
    if family != "dense":  # experts: 4, top 2, beside a shared expert
        extra = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, **extra)
        extra["shared_expert_intermediate_size"] = 48
    if family == "next":  # dense MLPs on odd layers, routing weights not renormalised
        extra = dict(decoder_sparse_step=2, norm_topk_prob=False, **extra)
    if family != "moe":
        extra["intermediate_size"] = 96
    return make(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=len(LAYER_TYPES),
        layer_types=LAYER_TYPES,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,  # RoPE on its first 8 dims (partial_rotary_factor's default 0.25)
        linear_num_key_heads=2,
        linear_num_value_heads=4,  # each q/k head serves two value heads
        linear_key_head_dim=8,
        linear_value_head_dim=12,
        linear_conv_kernel_dim=4,
        max_position_embeddings=1024,
        eos_token_id=1,
        bos_token_id=2,
        initializer_range=0.2,  # peaky logits: greedy ties between batched paths are unlikely
        attn_implementation="eager",
        **extra,
    )


def _randomise(model) -> None:
    """Norms start at 0 (zero-centred) or 1 (the gated one), dt_bias at 1: random ones, so a
    wrong convention shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "dt_bias" in name:
                p.copy_(0.3 * torch.randn_like(p) + (1.0 if "linear_attn.norm" in name else 0.0))


FAMILIES = {
    "dense": "Qwen3_5ForCausalLM",
    "moe": "Qwen3_5MoeForCausalLM",
    "next": "Qwen3NextForCausalLM",
}


def _save(family: str, folder) -> object:
    torch.manual_seed(0)
    model = getattr(transformers, FAMILIES[family])(_hf_config(family)).eval()
    _randomise(model)
    model.save_pretrained(folder)
    _word_level_tokenizer(folder)
    return model


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, object]:
    """(saved folder, the transformers model in fp32 eval mode)."""
    folder = tmp_path_factory.mktemp("qwen3_5")
    return folder, _save("dense", folder)


@pytest.fixture(scope="module")
def refs(qwen):
    """hf greedy continuations, memoised per (prompt, n)."""
    done: dict[tuple[tuple[int, ...], int], list[int]] = {}

    def ref(prompt: list[int], n: int = NEW) -> list[int]:
        key = (tuple(prompt), n)
        if key not in done:
            done[key] = hf_greedy(qwen[1], prompt, n)
        return done[key]

    return ref


def _greedy(n: int = NEW) -> SamplingParams:
    return SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)


def _tokens(results) -> list[list[int]]:
    return [r.token_ids for r in results]


def _engine(folder, **args: object) -> Engine:
    return Engine(str(folder), backend="cpu", dtype="float32", **{"max_total_tokens": 4096, **args})


# ---- the model against transformers' logits -------------------------------------------------


class _Stepper:
    """Our model stepped by hand: rows of recurrent state, slots in request order."""

    def __init__(self, folder) -> None:
        from localradix.loader.model_loader import load_model
        from localradix.model_api.attention import get_attention_backend
        from localradix.model_api.recurrent_plan import RecurrentLayout
        from localradix.model_api.recurrent_state import RecurrentStates

        self.model, config = load_model(str(folder), "float32", "cpu")
        backend = get_attention_backend("torch_native")
        self.attn = backend.from_model_config(config, 1024, torch.float32, "cpu")
        layout = RecurrentLayout.for_model(config)
        assert layout is not None
        self.states = RecurrentStates(layout, 4, torch.float32, "cpu", budget=1 << 20)
        self.tables: dict[int, list[int]] = {}
        self.next_slot = 1

    def step(self, new: dict[int, list[int]]) -> dict[int, torch.Tensor]:
        """{row: new tokens} -> {row: logits of those tokens}."""
        ids, tables, prefixes = [], [], []
        for row, tokens in new.items():
            table = self.tables.setdefault(row, [])
            prefixes.append(len(table))
            table += list(range(self.next_slot, self.next_slot + len(tokens)))
            self.next_slot += len(tokens)
            ids.append(np.array(tokens, dtype=np.int64))
            tables.append(np.array(table, dtype=np.int64))
        batch = ForwardBatch.build(ids, tables, prefixes, list(new))
        self.attn.prepare(batch)
        self.states.prepare(batch)
        with torch.inference_mode():
            positions = torch.from_numpy(batch.positions)
            hidden = self.model(
                torch.from_numpy(batch.input_ids), positions, self.attn, self.states
            )
            logits = self.model.compute_logits(hidden)
        bounds = batch.qo_indptr
        return {row: logits[bounds[i] : bounds[i + 1]] for i, row in enumerate(new)}


def test_logits_match_transformers_over_chunks_batches_and_restored_states(qwen):
    folder, hf = qwen
    a, b = random_prompts(7, (150, 40))  # a: over two chunks of the chunked form
    with torch.no_grad():
        want_a, want_b = (hf(torch.tensor([p])).logits[0] for p in (a, b))
    stepper = _Stepper(folder)
    states = stepper.states
    states.restore(0, None)
    states.restore(1, None)

    def close(got: torch.Tensor, want: torch.Tensor) -> None:
        torch.testing.assert_close(got, want, rtol=5e-4, atol=5e-4)

    # a prefill and another request's chunk in one batch, then decodes beside a long chunk
    got = stepper.step({0: a[:70], 1: b[:3]})
    close(got[0], want_a[:70])
    close(got[1], want_b[:3])
    for step in ({1: b[3:4], 0: a[70:71]}, {1: b[4:5], 0: a[71:72]}, {1: b[5:6]}):
        got = stepper.step(step)
        close(got[1], want_b[len(stepper.tables[1]) - 1 :][:1])
        if 0 in step:
            close(got[0], want_a[len(stepper.tables[0]) - 1 :][:1])
    got = stepper.step({0: a[72:150], 1: b[6:7]})  # a 78-token segment beside a decode
    close(got[0], want_a[72:150])
    close(got[1], want_b[6:7])
    # a snapshot of b, restored into another row, continues exactly like b
    handle, nbytes = states.save(1)
    assert nbytes == states.layout.row_bytes(torch.float32.itemsize) and states.live == 1
    states.restore(2, handle)
    stepper.tables[2] = list(stepper.tables[1])
    got = stepper.step({2: b[7:40]})
    close(got[2], want_b[7:40])
    states.release(handle)
    assert states.live == 0
    # a row must continue where its state is
    stepper.tables[1].append(1000)  # as if it had computed an 8th token
    with pytest.raises(RuntimeError, match="holds the state after 7 tokens, its step contin"):
        stepper.step({1: b[8:9]})


@pytest.mark.parametrize("family", ["moe", "next"])
def test_experts_and_qwen3_next_match_transformers(family, tmp_path):
    """Logits over a prompt, a chunk beside another request and decodes, then greedy through
    the Engine alone and batched (cache hits resuming from snapshots)."""
    hf = _save(family, tmp_path)
    a, b = random_prompts(8, (90, 20))
    with torch.no_grad():
        want_a, want_b = (hf(torch.tensor([p])).logits[0] for p in (a, b))
    stepper = _Stepper(tmp_path)
    stepper.states.restore(0, None)
    stepper.states.restore(1, None)
    got = stepper.step({0: a[:40], 1: b[:1]})
    torch.testing.assert_close(got[0], want_a[:40], rtol=5e-4, atol=5e-4)
    got = stepper.step({1: b[1:20], 0: a[40:41]})
    torch.testing.assert_close(got[1], want_b[1:20], rtol=5e-4, atol=5e-4)
    torch.testing.assert_close(got[0], want_a[40:41], rtol=5e-4, atol=5e-4)
    prompts = random_prompts(9, (7, 33, 12))
    want = [hf_greedy(hf, p, 8) for p in prompts]
    with _engine(tmp_path) as engine:
        assert engine.core.scheduler.runner.snapshots is not None
        assert _tokens(engine.generate(prompts, _greedy(8))) == want
        again = engine.generate(prompts, _greedy(8))
        assert _tokens(again) == want and sum(r.cached_tokens for r in again) > 0
        engine.check_invariants(idle=True)


def test_multimodal_checkpoint_serves_its_text_model(tmp_path):
    """`Qwen3_5ForConditionalGeneration` (the Hub's Qwen3.5 checkpoints): `text_config`, the
    `model.language_model.` weights; the vision tower is skipped. Greedy like transformers'."""
    torch.manual_seed(0)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)
    config = transformers.Qwen3_5Config(
        text_config=_hf_config().to_dict(), vision_config=vision, tie_word_embeddings=False
    )
    hf = transformers.Qwen3_5ForConditionalGeneration(config).eval()
    _randomise(hf)
    hf.save_pretrained(tmp_path)
    _word_level_tokenizer(tmp_path)
    prompts = random_prompts(3, (9, 30))
    with _engine(tmp_path) as engine:
        assert engine.core.scheduler.runner.config.architecture == "Qwen3_5ForConditionalGeneration"
        got = _tokens(engine.generate(prompts, _greedy(8)))
    assert got == [hf_greedy(hf, p, 8) for p in prompts]


def test_stacked_expert_tensors_load(tmp_path):
    """transformers 5's in-memory names (experts stacked, `mlp.experts.gate_up_proj`) load
    like the per-expert ones a checkpoint holds."""
    from localradix.models.qwen3_5 import Qwen3_5ForCausalLM

    hf = _save("moe", tmp_path)
    assert any(n.endswith("mlp.experts.gate_up_proj") for n, _ in hf.named_parameters())
    model = Qwen3_5ForCausalLM(_config("moe"))
    model.load_weights(hf.named_parameters())
    from localradix.loader.model_loader import load_model

    ref, _ = load_model(str(tmp_path), "float32", "cpu")
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        assert torch.equal(p, q), name


def test_chunked_delta_rule_matches_the_recurrent_step():
    from localradix.models.delta_net import chunked_delta_rule, delta_rule_step, l2_normalize

    gen = torch.Generator().manual_seed(0)
    length, heads, dk, dv = 150, 3, 8, 5
    q = l2_normalize(torch.randn(length, heads, dk, generator=gen)) * dk**-0.5
    k = l2_normalize(torch.randn(length, heads, dk, generator=gen))
    v = torch.randn(length, heads, dv, generator=gen)
    g = -torch.rand(length, heads, generator=gen)
    beta = torch.rand(length, heads, generator=gen)
    start = torch.randn(heads, dk, dv, generator=gen)
    out, state = chunked_delta_rule(q, k, v, g, beta, start, chunk=16)
    ref_state, ref = start[None], []
    for t in range(length):
        o, ref_state = delta_rule_step(
            q[t : t + 1], k[t : t + 1], v[t : t + 1], g[t : t + 1], beta[t : t + 1], ref_state
        )
        ref.append(o)
    torch.testing.assert_close(out, torch.cat(ref), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state, ref_state[0], rtol=1e-4, atol=1e-4)


# ---- through the Engine ---------------------------------------------------------------------


def test_alone_batched_and_cached_match_transformers(qwen, refs):
    folder, _ = qwen
    prompts = random_prompts(1, (5, 17, 70, 24, 3))
    want = [refs(p) for p in prompts]
    with _engine(folder, mixed_prefill="on") as engine:
        assert _tokens(engine.generate(prompts, _greedy())) == want  # batched, mixed lengths
        assert [engine.generate([p], _greedy())[0].token_ids for p in prompts] == want
        again = engine.generate(prompts, _greedy())  # each resumes from a snapshot
        assert _tokens(again) == want
        assert sum(r.cached_tokens for r in again) > 0
        # a prompt running on into its own output resumes at its prompt's end
        longer = engine.generate([prompts[2] + want[2][:6]], _greedy(6))[0]
        assert longer.token_ids == want[2][6:]
        assert longer.cached_tokens >= len(prompts[2])
        engine.check_invariants(idle=True)


def test_shared_system_prompt_and_multi_turn_chat_resume_from_snapshots(qwen, refs):
    folder, _ = qwen
    system = random_prompts(2, (45,))[0]
    tails = random_prompts(3, (6, 9, 4, 11))
    users = random_prompts(4, (5, 7, 3, 6, 4, 8))
    for cache_off in (False, True):
        with _engine(folder, disable_radix_cache=cache_off, snapshot_mib=0.05) as engine:
            first = engine.generate([system + tails[0]], _greedy())[0]
            rest = engine.generate([system + t for t in tails[1:]], _greedy())
            got = [first.token_ids] + _tokens(rest)
            assert got == [refs(system + t) for t in tails]
            if not cache_off:  # resumed at the stride snapshot inside the system prompt, or
                assert all(r.cached_tokens >= 32 for r in rest)  # past it
            # a six-turn chat: each turn's prompt holds the last one and its reply whole
            prompt: list[int] = []
            for turn, user in enumerate(users):
                prompt = prompt + user
                out = engine.generate([prompt], _greedy(6))[0]
                assert out.token_ids == refs(prompt, 6), f"turn {turn}"
                if turn and not cache_off:
                    assert out.cached_tokens >= len(prompt) - len(user) - 1
                prompt = prompt + out.token_ids
            engine.check_invariants(idle=True)
            runner = engine.core.scheduler.runner
            states, stats = runner.snapshots, engine.stats()
            assert states is not None and states.live == stats.snapshots
            if not cache_off:
                assert stats.snapshot_hits >= 7
            per = states.layout.row_bytes(torch.float32.itemsize)
            assert stats.snapshot_bytes <= states.budget and stats.snapshots <= states.budget // per
            assert engine.flush_cache()
            assert states.live == 0


def test_chunked_prefill_matches(qwen, refs):
    folder, _ = qwen
    prompts = random_prompts(5, (45, 21, 9, 140))
    want = [refs(p) for p in prompts]
    with _engine(folder, chunked_prefill_size=16) as engine:
        assert _tokens(engine.generate(prompts, _greedy())) == want
        longer = [p + r[:5] for p, r in zip(prompts, want, strict=True)]
        assert engine.flush_cache()
        assert _tokens(engine.generate(longer, _greedy(7))) == [r[5:] for r in want]
        engine.check_invariants(idle=True)


def test_retraction_under_kv_pressure_matches(qwen, refs):
    folder, _ = qwen
    prompts = random_prompts(6, (27, 28, 29, 30, 31, 32))
    want = [refs(p, 20) for p in prompts]
    with _engine(folder, max_total_tokens=180, new_token_ratio=0.05) as engine:
        assert _tokens(engine.generate(prompts, _greedy(20))) == want
        assert engine.stats().retractions > 0
        engine.check_invariants(idle=True)
        assert engine.flush_cache()
        assert engine.core.scheduler.runner.snapshots.live == 0


STEMS = (tuple(range(300, 360)), tuple(range(500, 440, -1)))


@st.composite
def _workloads(draw: st.DrawFn) -> list[tuple[int, tuple[int, ...], int | None]]:
    jobs = []
    for _ in range(draw(st.integers(1, 5))):
        stem = STEMS[draw(st.integers(0, 1))][: draw(st.integers(0, 60))]
        tail = tuple(draw(st.lists(st.integers(3, 290), min_size=1, max_size=10)))
        arrive = draw(st.integers(0, 5))
        abort = draw(st.none() | st.integers(arrive, arrive + 8))
        jobs.append((arrive, stem + tail, abort))
    return jobs


def _agrees(hf, prompt: list[int], got: list[int], want: list[int], tol: float = 1e-4) -> bool:
    """Greedy tokens equal, or parting where transformers' top two logits are within `tol`: a
    tie that float rounding between chunkings may break either way (logits agree to ~6e-5)."""
    i = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), None)
    if i is None:
        return len(got) == len(want)
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + want[:i]])).logits[0, -1]
    return float(logits[want[i]] - logits[got[i]]) < tol


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(work=_workloads(), pool=st.sampled_from([150, 600]), chunk=st.sampled_from([0, 16]))
# Found by hypothesis: this prompt's first greedy token is a tie (top two 6e-6 apart), which
# the snapshot stop at 32 tokens breaks the other way.
@example(work=[(0, (*range(300, 336), 22, 223, 95), None)], pool=150, chunk=0)
def test_random_workloads_match_transformers_and_leak_nothing(qwen, refs, work, pool, chunk):
    """Shared stems, aborts, a small pool (eviction, retraction) and a snapshot budget of a
    few: every request that runs to its end gives transformers' tokens; when idle the runner
    holds exactly the tree's snapshots; after a flush, none."""
    from localradix.config import ServerArgs
    from localradix.engine.core import EngineCore
    from localradix.messages import GenerateRequest

    args = ServerArgs(
        model=str(qwen[0]),
        backend="cpu",
        dtype="float32",
        max_total_tokens=pool,
        chunked_prefill_size=chunk,
        max_running_requests=4,
        new_token_ratio=0.05,  # admit eagerly so the small pool has to retract
        snapshot_mib=0.03,  # about four snapshots of this model
    )
    params = _greedy(6)
    core = EngineCore(args)
    got: dict[str, list[int]] = {}
    try:
        step = 0
        while step <= 14 or core.has_work():
            for i, (arrive, prompt, abort) in enumerate(work):
                if arrive == step:
                    core.add_request(GenerateRequest(str(i), prompt, params))
                if abort == step:
                    core.abort(str(i))
            for out in core.step():
                assert out.error is None, out.error
                got.setdefault(out.rid, []).extend(out.new_token_ids)
            if core.scheduler.idle:
                core.scheduler.check_invariants(idle=True)
            step += 1
            assert step < 2000, "the scheduler stopped making progress"
        states = core.scheduler.runner.snapshots
        assert states is not None and states.live == core.scheduler.cache.snapshots.count
        assert core.flush_cache() and states.live == 0
    finally:
        core.close()
    for i, (_, prompt, abort) in enumerate(work):
        if abort is None:
            assert _agrees(qwen[1], list(prompt), got[str(i)], refs(list(prompt), 6)), (
                f"request {i}"
            )


def _serve(runner, prompts: list[list[int]]) -> list[list[int]]:
    """Greedy tokens of each prompt, twice (the second round resumes from snapshots)."""
    from localradix.messages import GenerateRequest
    from localradix.sched.sched_config import SchedulerConfig
    from localradix.sched.scheduler import Scheduler

    config = SchedulerConfig.of(max_running_requests=4, chunked_prefill_size=8)
    sched = Scheduler(
        runner,
        config,
        context_len=256,
        eos_token_ids=(),
        decode=lambda ids: "",
        vocab_size=VOCAB,
    )
    tokens: dict[str, list[int]] = {}
    for round_ in range(2):
        for i, p in enumerate(prompts):
            sched.add_request(GenerateRequest(f"{round_}-{i}", tuple(p), _greedy(6)))
        while sched.has_work():
            for out in sched.step():
                tokens.setdefault(out.rid, []).extend(out.new_token_ids)
    sched.check_invariants(idle=True)
    assert sched.cache.snapshots is not None and sched.cache.snapshots.hits > 0
    return [tokens[rid] for rid in sorted(tokens)]


def test_device_runner_runs_eagerly_without_overlap(qwen, monkeypatch):
    """The GPU runner (here on the CPU, FlashInfer and CUDA graphs faked): no decode graphs
    (a replay would not take the states' plan), no overlap scheduling (a snapshot is the
    state after the steps read so far), FlashInfer's cache holds only the full-attention
    layers, and the scheduler gets the same tokens through it as through torch-native."""
    import sys

    from backends.gpu_fakes import FakeFlashInfer, FakeGraphApi

    from localradix.backends.cuda.attention import FlashInferAttention
    from localradix.backends.cuda.runner import DeviceRunner
    from localradix.config import ServerArgs
    from localradix.engine.core import _with_overlap
    from localradix.loader.model_loader import load_model

    fake = FakeFlashInfer()
    monkeypatch.setitem(sys.modules, "flashinfer", fake.module())
    monkeypatch.setattr(FlashInferAttention, "workspace_bytes", 1024)
    model, config = load_model(str(qwen[0]), "float16", "cpu")
    args = ServerArgs(max_total_tokens=1023, max_running_requests=4, context_length=256)
    api = FakeGraphApi(fake)
    fi = DeviceRunner(model, config, args, "cpu", torch.float16, "flashinfer", graph_api=api)
    assert fi.graphs is None and api.captured == [] and fi.snapshots is fi.states
    assert fi.attn.num_layers == 2 and not fi.verifies
    assert _with_overlap(fi, True, args, "cuda") is fi
    native = DeviceRunner(model, config, args, "cpu", torch.float16, "torch_native")
    prompts = random_prompts(12, (13, 30, 5))  # (fp16: no near-ties among these)
    prompts.append(prompts[1][:20] + prompts[0])  # a cache hit inside another's prompt
    assert _serve(fi, prompts) == _serve(native, prompts)
    assert fake.plans["prefill"] > 0


# ---- config, refusals -----------------------------------------------------------------------


def _config(family: str = "dense", **extra: object) -> ModelConfig:
    return ModelConfig.from_hf_dict(_hf_config(family, **extra).to_dict())


def test_config_parses():
    c = _config()
    assert c.architecture == "Qwen3_5ForCausalLM" and not c.tie_word_embeddings
    assert c.linear_layers == (True, False, True, True, False) and c.kv_layers == 2
    assert (c.linear_key_heads, c.linear_value_heads) == (2, 4)
    assert (c.linear_key_head_dim, c.linear_value_head_dim, c.linear_conv_kernel) == (8, 12, 4)
    assert c.rotary_dim == 8 and c.qk_norm and c.offset_norms and c.attn_output_gate
    assert c.layer_windows() == ()
    assert (
        "gated delta-net linear attention layers" in c.extensions()
    )  # (backends name what they lack)
    assert ModelConfig.from_dict(c.to_dict()) == c
    # no layer_types: every full_attention_interval-th layer is full attention
    d = _hf_config().to_dict()
    del d["layer_types"], d["architectures"]
    d["num_hidden_layers"], d["full_attention_interval"] = 6, 3
    c = ModelConfig.from_hf_dict(d)
    assert c.linear_layers == (True, True, False, True, True, False) and c.kv_layers == 2
    assert c.architecture == "Qwen3_5ForCausalLM"
    moe, nxt = _config("moe"), _config("next")
    assert (moe.architecture, nxt.architecture) == ("Qwen3_5MoeForCausalLM", "Qwen3NextForCausalLM")
    assert moe.num_experts == 4 and moe.shared_expert_size == moe.intermediate_size == 48
    assert moe.norm_topk_prob and all(moe.uses_moe(i) for i in range(len(LAYER_TYPES)))
    assert not nxt.norm_topk_prob and nxt.intermediate_size == 96
    assert [nxt.uses_moe(i) for i in range(len(LAYER_TYPES))] == [False, True, False, True, False]
    for c in (moe, nxt):
        assert c.linear_layers == (True, False, True, True, False) and c.rotary_dim == 8


def test_tensor_parallel_refuses_qwen3_5():
    from localradix.model_api.shard import Shard

    with pytest.raises(ValueError, match="--tp 2 does not split Qwen3_5ForCausalLM's gated"):
        Shard(0, 2).check(_config())
    Shard(0, 1).check(_config())


def test_kv_and_state_snapshots_outlive_eviction_and_a_restart(qwen, refs, tmp_path):
    """With the disk tier on, a hybrid's cached prefixes survive eviction and a restart: the
    full-attention KV and the recurrent-state snapshots go down and come back, a request resumes
    from a state loaded back, and its tokens are transformers'."""
    folder, _ = qwen
    disk = {"kv_disk_cache": str(tmp_path), "kv_disk_gib": 1.0}
    systems = random_prompts(7, (70, 75, 72))
    tails = random_prompts(8, (6, 9, 5))
    chat = random_prompts(9, (20, 7))
    with _engine(folder, max_total_tokens=200, **disk) as engine:  # holds about two
        for system in systems:
            assert engine.generate([system + tails[0]], _greedy())[0].token_ids == refs(
                system + tails[0]
            )
        again = engine.generate([systems[0] + tails[1]], _greedy())[0]  # evicted: from disk
        assert again.token_ids == refs(systems[0] + tails[1]) and again.cached_tokens >= 64
        stats = engine.stats().kv_tiers
        assert stats["demoted_states"] >= 1 and stats["promoted_states"] >= 1
        turn = engine.generate([chat[0]], _greedy())[0]
        engine.check_invariants(idle=True)
    reply = chat[0] + turn.token_ids
    with _engine(folder, **disk) as engine:  # a restart: nothing cached in memory
        results = [engine.generate([s + tails[2]], _greedy())[0] for s in systems]
        assert _tokens(results) == [refs(s + tails[2]) for s in systems]
        assert all(r.cached_tokens >= 64 for r in results)  # the 64-token stride snapshots
        follow = engine.generate([reply + chat[1]], _greedy())[0]  # the chat's next turn
        assert follow.token_ids == refs(reply + chat[1])
        assert follow.cached_tokens == len(reply) - 1  # its end-of-turn snapshot
        assert engine.stats().kv_tiers["promoted_states"] >= 4
        engine.check_invariants(idle=True)
