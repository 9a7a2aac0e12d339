"""Qwen3.5, Qwen3.5-MoE and Qwen3-Next on the MLX backend (float32), held to transformers with
the torch tests' tiny checkpoints (tests/models/test_qwen3_5.py): logits over chunkings, mixed
batches and restored (or exported and adopted) states, attention biases; greedy through the
Engine token for token alone, batched, chunked, retracted, from a multimodal checkpoint, with
the radix cache on (resuming from the runner's state snapshots, also after a restart from the
disk tier) and off, and under random workloads; snapshots accounted for when idle and freed by
a flush. An 8-bit Qwen3-Next decodes like its dequantized twin; bfloat16 runs and caches."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localradix import Engine, SamplingParams
from localradix.step import ForwardBatch

from .conftest import hf_greedy, load_test_module, random_prompts, requires_mlx
from .test_mlx_quantized import write_mlx_quantized

pytestmark = requires_mlx
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
mx = pytest.importorskip("mlx.core")
_qwen = load_test_module("models/test_qwen3_5.py")

NEW = 12


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """transformers' references on one thread: with the cores shared, much faster."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory):
    """(saved folder, the transformers model in fp32 eval mode)."""
    folder = tmp_path_factory.mktemp("mlx_qwen3_5")
    return folder, _qwen._save("dense", folder)


def _greedy(n: int = NEW) -> SamplingParams:
    return SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)


def _tokens(results) -> list[list[int]]:
    return [r.token_ids for r in results]


def _engine(folder, **args: object) -> Engine:
    return Engine(
        str(folder), backend="mlx", **{"dtype": "float32", "max_total_tokens": 4096, **args}
    )


def _hf_logits(hf, prompt: list[int]) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.tensor([prompt])).logits[0].numpy()


class _Stepper:
    """The MLX model stepped by hand: rows of recurrent state, slots in request order."""

    def __init__(self, folder) -> None:
        from localradix.backends.mlx.attention import MLXPagedAttention
        from localradix.backends.mlx.recurrent_state import MLXRecurrentStates
        from localradix.backends.mlx.runner import mlx_lacks, mlx_model_class
        from localradix.backends.mlx.weights import load_weights
        from localradix.loader import resolve_model
        from localradix.model_api.kv_layout import KVLayout
        from localradix.model_api.recurrent_plan import RecurrentLayout

        config, weights = load_weights(resolve_model(str(folder)))
        assert mlx_lacks(config) == []
        self.model = mlx_model_class(config)(config, weights, mx.float32)
        layout = KVLayout.for_model(config, "float32").with_slots(1024)
        self.attn = MLXPagedAttention(layout, mx.float32)
        state_layout = RecurrentLayout.for_model(config)
        assert state_layout is not None
        self.states = MLXRecurrentStates(state_layout, 4, mx.float32, budget=1 << 20)
        self.tables: dict[int, list[int]] = {}
        self.next_slot = 1

    def step(self, new: dict[int, list[int]]) -> dict[int, np.ndarray]:
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
        input_ids = mx.array(batch.input_ids.astype(np.int32))
        hidden = self.model.forward(
            input_ids, mx.array(batch.positions.astype(np.int32)), self.attn, self.states
        )
        logits = np.array(self.model.compute_logits(hidden))
        bounds = batch.qo_indptr
        return {row: logits[bounds[i] : bounds[i + 1]] for i, row in enumerate(new)}


def _close(got: np.ndarray, want: np.ndarray, tol: float = 1e-3) -> None:
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_logits_match_transformers_over_chunks_batches_and_restored_states(dense):
    folder, hf = dense
    a, b = random_prompts(7, (150, 40))  # a: over two chunks of the chunked form
    want_a, want_b = _hf_logits(hf, a), _hf_logits(hf, b)
    stepper = _Stepper(folder)
    states = stepper.states
    states.restore(0, None)
    states.restore(1, None)
    # a prefill beside another request's chunk, then decodes, then a long chunk beside a decode
    got = stepper.step({0: a[:70], 1: b[:3]})
    _close(got[0], want_a[:70])
    _close(got[1], want_b[:3])
    got = stepper.step({1: b[3:4], 0: a[70:71]})
    _close(got[1], want_b[3:4])
    _close(got[0], want_a[70:71])
    got = stepper.step({0: a[71:150], 1: b[4:5]})
    _close(got[0], want_a[71:150])
    _close(got[1], want_b[4:5])
    # a snapshot of b continues exactly like b in another row, and so does its bytes' copy
    handle, nbytes = states.save(1)
    assert nbytes == states.layout.row_bytes(mx.float32.size) and states.live == 1
    adopted, _ = states.adopt(states.export(handle), 5)
    states.restore(2, handle)
    states.restore(3, adopted)
    states.release(handle)  # (restored already: the rows hold their own copies)
    stepper.tables[2] = list(stepper.tables[1])
    stepper.tables[3] = list(stepper.tables[1])
    got = stepper.step({2: b[5:40], 3: b[5:6]})
    _close(got[2], want_b[5:40])
    _close(got[3], want_b[5:6])
    states.release(adopted)
    assert states.live == 0
    # a row must continue where its state is
    stepper.tables[1].append(1000)  # as if it had computed a 6th token
    with pytest.raises(RuntimeError, match="holds the state after 5 tokens, its step contin"):
        stepper.step({1: b[6:7]})


def test_attention_biases_match_transformers(tmp_path):
    """q/k/v/o biases (`attention_bias`): q_proj's split into queries and gates like its rows."""
    torch.manual_seed(0)
    hf = transformers.Qwen3_5ForCausalLM(_qwen._hf_config(attention_bias=True)).eval()
    _qwen._randomise(hf)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("proj.bias"):
                p.copy_(0.3 * torch.randn_like(p))
    hf.save_pretrained(tmp_path)
    prompt = random_prompts(11, (30,))[0]
    stepper = _Stepper(tmp_path)
    stepper.states.restore(0, None)
    _close(stepper.step({0: prompt})[0], _hf_logits(hf, prompt))


def test_chunked_delta_rule_matches_the_recurrent_step():
    from localradix.backends.mlx.delta_net import (
        chunked_delta_rule,
        delta_rule_step,
        l2_normalize,
    )

    rng = np.random.default_rng(0)
    length, heads, dk, dv = 70, 3, 8, 5

    def arr(*shape: int) -> mx.array:
        return mx.array(rng.standard_normal(shape).astype(np.float32))

    q, k = l2_normalize(arr(length, heads, dk)) * dk**-0.5, l2_normalize(arr(length, heads, dk))
    v, start = arr(length, heads, dv), arr(heads, dk, dv)
    g = mx.array(-rng.random((length, heads), dtype=np.float32))
    beta = mx.array(rng.random((length, heads), dtype=np.float32))
    out, state = chunked_delta_rule(q, k, v, g, beta, start, chunk=16)
    ref_state, ref = start[None], []
    for t in range(length):
        o, ref_state = delta_rule_step(
            q[t : t + 1], k[t : t + 1], v[t : t + 1], g[t : t + 1], beta[t : t + 1], ref_state
        )
        ref.append(o)
    _close(np.array(out), np.array(mx.concatenate(ref)), 1e-4)
    _close(np.array(state), np.array(ref_state[0]), 1e-4)


def test_alone_batched_cached_and_chunked_match_transformers(dense):
    folder, hf = dense
    prompts = random_prompts(1, (5, 17, 70, 24, 3))
    want = [hf_greedy(hf, p, NEW) for p in prompts]
    with _engine(folder) as engine:
        runner = engine.core.scheduler.runner
        assert runner.snapshots is runner.states and not runner.verifies
        assert _tokens(engine.generate(prompts, _greedy())) == want  # batched, mixed lengths
        assert [engine.generate([p], _greedy())[0].token_ids for p in prompts] == want
        again = engine.generate(prompts, _greedy())  # each resumes from a snapshot
        assert _tokens(again) == want and sum(r.cached_tokens for r in again) > 0
        # a prompt running on into its own output resumes at its prompt's end
        longer = engine.generate([prompts[2] + want[2][:6]], _greedy(6))[0]
        assert longer.token_ids == want[2][6:] and longer.cached_tokens >= len(prompts[2])
        engine.check_invariants(idle=True)
    with _engine(folder, chunked_prefill_size=16) as engine:
        assert _tokens(engine.generate(prompts, _greedy())) == want
        engine.check_invariants(idle=True)


def test_shared_system_prompt_and_multi_turn_chat_resume_from_snapshots(dense):
    folder, hf = dense
    system = random_prompts(2, (45,))[0]
    tails = random_prompts(3, (6, 9, 4))
    users = random_prompts(4, (5, 7, 3, 6))
    outputs: dict[bool, list[list[int]]] = {}
    for cache_off in (False, True):
        got = []
        with _engine(folder, disable_radix_cache=cache_off, snapshot_mib=0.05) as engine:
            got.append(engine.generate([system + tails[0]], _greedy())[0].token_ids)
            rest = engine.generate([system + t for t in tails[1:]], _greedy())
            got += _tokens(rest)
            if not cache_off:  # resumed at the stride snapshot inside the system prompt, or
                assert all(r.cached_tokens >= 32 for r in rest)  # past it
            prompt: list[int] = []
            for turn, user in enumerate(users):  # each turn's prompt holds the last whole
                prompt = prompt + user
                out = engine.generate([prompt], _greedy(6))[0]
                if turn and not cache_off:
                    assert out.cached_tokens >= len(prompt) - len(user) - 1
                got.append(out.token_ids)
                prompt = prompt + out.token_ids
            engine.check_invariants(idle=True)
            states, stats = engine.core.scheduler.runner.snapshots, engine.stats()
            assert states is not None and states.live == stats.snapshots
            assert stats.snapshot_bytes <= states.budget
            if not cache_off:
                assert stats.snapshot_hits >= 5
            assert engine.flush_cache() and states.live == 0
        outputs[cache_off] = got
    assert outputs[False] == outputs[True]
    chat: list[int] = []
    want = [hf_greedy(hf, system + t, NEW) for t in tails]
    for user, reply in zip(users, outputs[False][len(tails) :], strict=True):
        chat += user
        want.append(hf_greedy(hf, chat, 6))
        chat += reply
    assert outputs[False] == want


def test_multimodal_checkpoint_serves_its_text_model(tmp_path):
    """`Qwen3_5ForConditionalGeneration` (the Hub's Qwen3.5 checkpoints): `text_config`, the
    `model.language_model.` weights; the vision tower is skipped. Greedy like transformers'."""
    torch.manual_seed(0)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)
    config = transformers.Qwen3_5Config(
        text_config=_qwen._hf_config().to_dict(), vision_config=vision, tie_word_embeddings=False
    )
    hf = transformers.Qwen3_5ForConditionalGeneration(config).eval()
    _qwen._randomise(hf)
    hf.save_pretrained(tmp_path)
    _qwen._word_level_tokenizer(tmp_path)
    prompts = random_prompts(3, (9, 30))
    with _engine(tmp_path) as engine:
        got = _tokens(engine.generate(prompts, _greedy(8)))
    assert got == [hf_greedy(hf, p, 8) for p in prompts]


def test_quantized_qwen3_next_decodes_like_its_dequantized_twin(tmp_path):
    """An mlx-format 8-bit Qwen3-Next folder (experts, shared experts, the regrouped fused
    delta-net projections all packed) runs as stored and gives the greedy tokens of its
    dequantized float twin in transformers. Matrices whose rows do not split into groups of 32
    stay float, as mlx-lm leaves them."""
    hf = _qwen._save("next", tmp_path / "float")
    quantization: dict = {"group_size": 32, "bits": 8}
    for i, kind in enumerate(_qwen.LAYER_TYPES):  # (48-wide inputs)
        if kind == "linear_attention":
            quantization[f"model.layers.{i}.linear_attn.out_proj"] = False
        if hf.config.decoder_sparse_step and (i + 1) % hf.config.decoder_sparse_step == 0:
            quantization[f"model.layers.{i}.mlp.shared_expert.down_proj"] = False
    folder = write_mlx_quantized(tmp_path / "float", tmp_path / "mlx", quantization)
    twin = _dequantized_twin(folder, tmp_path / "float", tmp_path / "twin")
    prompts = random_prompts(12, (9, 40))
    with _engine(folder) as engine:
        assert engine.core.scheduler.runner.weight_bytes < 0.6 * _float_bytes(tmp_path / "float")
        got = _tokens(engine.generate(prompts, _greedy(8)))
    assert got == [hf_greedy(twin, p, 8) for p in prompts]


def _dequantized_twin(folder, float_folder, dst):
    """transformers' model of `folder`'s weights dequantized (float32), loaded as a checkpoint
    (so its per-expert names are stacked as transformers stacks them)."""
    import shutil

    from localradix.backends.mlx.weights import group_quantized

    config = json.loads((folder / "config.json").read_text())
    stored = group_quantized(mx.load(str(folder / "model.safetensors")), config["quantization"])
    dense = {n: w if isinstance(w, mx.array) else w.dequantize() for n, w in stored.items()}
    dst.mkdir()
    mx.save_safetensors(str(dst / "model.safetensors"), dense, metadata={"format": "pt"})
    shutil.copy(float_folder / "config.json", dst / "config.json")
    return transformers.AutoModelForCausalLM.from_pretrained(dst, dtype=torch.float32).eval()


def _float_bytes(folder) -> int:
    return sum(a.nbytes for a in mx.load(str(folder / "model.safetensors")).values())


@pytest.mark.parametrize("family", ["moe", "next"])
def test_experts_and_qwen3_next_match_transformers(family, tmp_path):
    """Logits over a prompt, a chunk beside another request and decodes, then greedy through
    the Engine alone and batched (cache hits resuming from snapshots)."""
    hf = _qwen._save(family, tmp_path)
    a, b = random_prompts(8, (90, 20))
    want_a, want_b = _hf_logits(hf, a), _hf_logits(hf, b)
    stepper = _Stepper(tmp_path)
    stepper.states.restore(0, None)
    stepper.states.restore(1, None)
    got = stepper.step({0: a[:40], 1: b[:1]})
    _close(got[0], want_a[:40])
    got = stepper.step({1: b[1:20], 0: a[40:41]})
    _close(got[1], want_b[1:20])
    _close(got[0], want_a[40:41])
    prompts = random_prompts(9, (7, 33, 12))
    want = [hf_greedy(hf, p, 8) for p in prompts]
    with _engine(tmp_path) as engine:
        assert _tokens(engine.generate(prompts, _greedy(8))) == want
        again = engine.generate(prompts, _greedy(8))
        assert _tokens(again) == want and sum(r.cached_tokens for r in again) > 0
        engine.check_invariants(idle=True)


def test_snapshots_outlive_a_restart_on_disk(dense, tmp_path):
    """With the disk tier on, the snapshots go down as bytes (`export`) and come back
    (`adopt`): after a restart a chat's next turn resumes from its end-of-turn snapshot, with
    transformers' tokens."""
    folder, hf = dense
    disk = {"kv_disk_cache": str(tmp_path), "kv_disk_gib": 1.0}
    first, second = random_prompts(9, (20, 7))
    with _engine(folder, **disk) as engine:
        reply = first + engine.generate([first], _greedy())[0].token_ids
    with _engine(folder, **disk) as engine:
        out = engine.generate([reply + second], _greedy())[0]
        assert out.token_ids == hf_greedy(hf, reply + second, NEW)
        assert out.cached_tokens == len(reply) - 1
        assert engine.stats().kv_tiers["promoted_states"] >= 1
        engine.check_invariants(idle=True)


def test_retraction_under_kv_pressure_matches(dense):
    """A pool too small for every request: some are retracted and resumed (from a snapshot
    or from nothing), with transformers' tokens; nothing leaks."""
    folder, hf = dense
    prompts = random_prompts(6, (27, 28, 29, 30, 31, 32))
    want = [hf_greedy(hf, p, 20) for p in prompts]
    with _engine(folder, max_total_tokens=180, new_token_ratio=0.05) as engine:
        assert _tokens(engine.generate(prompts, _greedy(20))) == want
        assert engine.stats().retractions > 0
        engine.check_invariants(idle=True)
        assert engine.flush_cache() and engine.core.scheduler.runner.snapshots.live == 0


def test_bfloat16_runs_and_caches(dense):
    """Half precision: conv state in bfloat16 (exported as raw bytes), recurrent state and
    the delta rule in float32; a repeated prompt resumes from its snapshot alike."""
    folder, _ = dense
    prompts = random_prompts(10, (5, 70))
    with _engine(folder, dtype="bfloat16") as engine:
        first = engine.generate(prompts, _greedy(6))
        again = engine.generate(prompts, _greedy(6))
        assert _tokens(again) == _tokens(first) and again[1].cached_tokens >= 64
        states = engine.core.scheduler.runner.snapshots
        handle, nbytes = states.save(0)
        assert len(states.export(handle)) == nbytes == states.layout.row_bytes(mx.bfloat16.size)
        states.release(handle)
        engine.check_invariants(idle=True)


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(work=_qwen._workloads(), pool=st.sampled_from([150, 600]), chunk=st.sampled_from([0, 16]))
def test_random_workloads_match_transformers_and_leak_nothing(dense, work, pool, chunk):
    """Shared stems, aborts, a small pool (eviction, retraction) and a budget of a few
    snapshots: every request that runs to its end gives transformers' tokens (or parts from
    them only at a true tie: `_agrees`); when idle the runner holds exactly the tree's
    snapshots; after a flush, none."""
    from localradix.config import ServerArgs
    from localradix.engine.core import EngineCore
    from localradix.messages import GenerateRequest

    folder, hf = dense
    args = ServerArgs(
        model=str(folder),
        backend="mlx",
        dtype="float32",
        max_total_tokens=pool,
        chunked_prefill_size=chunk,
        max_running_requests=4,
        new_token_ratio=0.05,  # admit eagerly so the small pool has to retract
        snapshot_mib=0.03,  # about four snapshots of this model
    )
    core = EngineCore(args)
    got: dict[str, list[int]] = {}
    try:
        step = 0
        while step <= 14 or core.has_work():
            for i, (arrive, prompt, abort) in enumerate(work):
                if arrive == step:
                    core.add_request(GenerateRequest(str(i), prompt, _greedy(6)))
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
            want = hf_greedy(hf, list(prompt), 6)
            assert _qwen._agrees(hf, list(prompt), got[str(i)], want), f"request {i}"


def _as_mlx_lm(src, dst, quantization: dict | None = None, layout: bool = True):
    """`src` (a Hugging Face Qwen3.5 folder) laid out as mlx-lm saves its conversion: under its
    VLM wrapper's names, conv1d weights in MLX's [channels, kernel, 1] layout, the (1 + w)
    norms stored as 1 + w (its qwen3_5 `sanitize`); linear layers quantized if asked (with
    `layout` off: only that, under the checkpoint's own names and forms)."""
    import shutil

    norms = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight",
             ".q_norm.weight", ".k_norm.weight")  # fmt: skip
    out, wrap = {}, "language_model." if layout else ""
    for name, w in mx.load(str(src / "model.safetensors")).items():
        if layout and name.endswith("conv1d.weight"):
            w = w.moveaxis(2, 1)
        elif layout and w.ndim == 1 and name.endswith(norms):
            w = w + 1.0
        elif quantization and name.endswith("proj.weight") and w.shape[-1] % 32 == 0:
            q, scales, biases = mx.quantize(w, quantization["group_size"], quantization["bits"])
            stem = name.removesuffix(".weight")
            out.update({f"{wrap}{stem}.scales": scales, f"{wrap}{stem}.biases": biases})
            w = q
        out[f"{wrap}{name}"] = w
    dst.mkdir()
    mx.save_safetensors(str(dst / "model.safetensors"), out, metadata={"format": "mlx"})
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / f, dst / f)
    config = json.loads((src / "config.json").read_text())
    if quantization:
        config["quantization"] = quantization
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_mlx_lm_converted_folders_load_as_their_checkpoint(dense, tmp_path):
    """mlx-lm's layout (wrapper names, MLX conv layout, shifted norms) gives the checkpoint's
    own greedy tokens; quantized, the tokens of the same quantized weights under the
    checkpoint's own names (whose quantized decoding other tests hold to a dequantized twin)."""
    folder, hf = dense
    prompts = random_prompts(4, (9, 30))
    with _engine(_as_mlx_lm(folder, tmp_path / "mlx_lm")) as engine:
        assert _tokens(engine.generate(prompts, _greedy())) == [
            hf_greedy(hf, p, NEW) for p in prompts
        ]
    bits = {"group_size": 32, "bits": 8}
    got = {}
    for layout in (True, False):
        quantized = _as_mlx_lm(folder, tmp_path / f"8bit_{layout}", bits, layout)
        with _engine(quantized) as engine:
            got[layout] = _tokens(engine.generate(prompts, _greedy()))
            assert engine.core.scheduler.runner.weight_bytes < 0.8 * _float_bytes(folder)
    assert got[True] == got[False]
