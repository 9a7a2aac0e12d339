"""LlamaCppRunner: the ModelRunner on llama.cpp (llama-cpp-python's low-level API).

llama.cpp runs the GGUF weights in their own quantization and computes logits; localradix's
scheduler, radix cache and sampler decide what runs, what is cached and which token comes
next, as on every other backend. One context with the unified KV cache holds every request:
a cached prefix is shared by tagging its cells with the request's sequence id (`SeqMap`), and
one `llama_decode` runs each step's mixed batch of prefill chunks and decodes.

Any architecture llama.cpp loads runs here: the runner reads what the scheduler needs from
llama.cpp itself. Models with recurrent layers (hybrid or pure) also keep snapshots of their
recurrent state at radix nodes (`LlamaStates`); sliding-window models keep every cell
(`swa_full`) and tag each with a twin sequence too (`swa_twins.py`), so that llama.cpp never
reuses a cached cell that has slid out of its sequence's window.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import psutil

from localradix.backends.llamacpp import SPEC
from localradix.backends.llamacpp.batch import LlamaBatch
from localradix.backends.llamacpp.cell_blob import BlobError, CellLayout
from localradix.backends.llamacpp.kv_transfer import LlamaKVTransfer, save_state
from localradix.backends.llamacpp.seq_map import SeqMap
from localradix.backends.llamacpp.states import LlamaStates
from localradix.backends.llamacpp.swa_twins import TwinnedMemory
from localradix.loader.llama_openmp import settle_openmp
from localradix.model_api.kv_layout import KVLayout
from localradix.models.config import ModelConfig
from localradix.runner.base import ModelRunner
from localradix.runner.kv_budget import KVBudget, plan_kv_budget, snapshot_budget
from localradix.step import ForwardBatch, SampleOutput, SamplingBatch

if TYPE_CHECKING:
    from collections.abc import Callable

    from localradix.mem.kv_pool import KVPool
    from localradix.platform import Target
    from localradix.runner.runner_config import RunnerConfig
    from localradix.store.source import ModelSource

logger = logging.getLogger("localradix.runner")

KV_TYPES = {"float32": 0, "float16": 1, "bfloat16": 30}  # ggml_type of the K and V cache
FLASH_ATTN_ENABLED = 1  # the CPU kernel skips other sequences' cells; the plain path does not
# The CPU flash kernel runs one pass per query, so a verify row costs a decode step's
# attention (a 9-row verify at 4.3k context: 167 ms, vs 108 ms on the plain path, which
# multiplies the k + 1 queries at once). The plain path is not used for verifying: its logits
# moved further with the batch's shape (on/off greedy outputs of the retraction test parted
# at 0.14 and 0.29 nat gaps, vs one 0.05 nat tie with the flash kernel).
UBATCH = 512  # llama.cpp's default physical batch
# How many idle cached cells cost about a quarter of a token's matmul work, per unit of
# (2 * params) / (heads * layers): every step's attention scans every live cell of the unified
# cache, per head and layer. Measured on SmolLM2-135M with 2 threads: ~8k idle cells made an
# 8-request decode step ~1.6x slower, so its budget is ~4k cells; an 8B model's is ~64k.
IDLE_CELLS_PER_WORK = 1 / 244
# Recurrent-state snapshots live in host memory and each saves a whole prefill of its path, so
# by default they may take a quarter of the free memory, up to llama-server's --cache-ram
# default. A real hybrid's state is large (Qwen3.5-0.8B's shape: 18 MiB), and a budget sized
# from the KV pool (~5 of them) left 4 concurrent chats re-prefilling (2.7% cached, vs 84%).


def create_llamacpp_runner(
    args: RunnerConfig, source: ModelSource, target: Target
) -> tuple[LlamaCppRunner, ModelConfig]:
    if source.kind != "gguf":
        raise ValueError(
            f"the llamacpp backend runs GGUF files; {source.path} is a Hugging Face folder "
            "(use --backend cpu, or convert it to GGUF)"
        )
    runner = LlamaCppRunner(source.path, args, target)
    return runner, runner.config


def default_threads() -> int:
    """Physical cores: llama.cpp's matmuls gain nothing from hyper-threads."""
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


class LlamaCppRunner(ModelRunner):
    # A CPU step reads every weight once whatever its token count: decode tokens ride along.
    mixes_decode_into_prefill = SPEC.mixes_decode_into_prefill
    verifies = True  # output flags on every row of `logit_index`

    def __init__(self, path: Path, args: RunnerConfig, target: Target) -> None:
        settle_openmp()
        import llama_cpp.llama_cpp as llama

        from localradix.runner.sampler import sample  # the same sampler as every backend

        _quiet_llama(args.log_level)
        _one_torch_thread()
        self.llama, self._sample = llama, sample
        llama.llama_backend_init()
        self.model = _load_model(llama, path, gpu=target.device != "cpu")
        self.recurrent = bool(
            llama.llama_model_is_recurrent(self.model) or llama.llama_model_is_hybrid(self.model)
        )
        self.verifies = not self.recurrent  # a recurrent state cannot take back rejected drafts
        self.config = _config(llama, self.model, path if self.recurrent else None)
        self.weight_bytes = int(llama.llama_model_size(self.model))  # tensor data, as stored
        self.n_vocab = self.config.vocab_size
        self.n_seq = int(llama.llama_max_parallel_sequences())
        rows = args.max_running_requests + 2  # the scheduler's request-table rows
        self.window = int(llama.llama_model_n_swa(self.model))  # 0: no sliding window
        self.twins = self.window > 0 and not self.recurrent
        # KV goes to the cache tiers through one spare sequence; a model with both sliding
        # windows and recurrent layers keeps it in memory (its twins would double the states).
        self.tiers_kv = not self.window or self.twins
        if self.recurrent:  # llama.cpp allocates a recurrent state per sequence id
            self.n_seq = min(self.n_seq, 2 * rows + self.tiers_kv)
        mapped = (self.n_seq - self.tiers_kv) // (1 + self.twins)
        self.max_running_requests = min(args.max_running_requests, mapped // 2 - 2)
        if self.max_running_requests < args.max_running_requests:
            why = "twinned for sliding windows" if self.twins else "a row and a ghost each"
            lowered = (mapped, why, args.max_running_requests, self.max_running_requests)
            logger.warning(
                "llama.cpp's %d sequence ids (%s): --max-running-requests %d -> %d", *lowered
            )
        self.kv_budget = self._kv_budget(args, target.dtype)
        self.kv_capacity = self.kv_budget.tokens
        self.idle_cache_budget = self._idle_cache_budget()
        self.threads = args.threads or default_threads()
        max_batch = max(args.max_prefill_tokens, args.chunked_prefill_size, rows)
        # Logits rows of a step: one per request, k + 1 for a request verifying k drafts.
        self.max_outputs = rows * (args.speculative_k + 1) if args.speculative else rows
        self.ctx = _new_context(llama, self.model, self._context_params(args, target, max_batch))
        self.memory = llama.llama_get_memory(self.ctx)
        # llama.cpp caps a batch at the context size: read back what it settled on.
        twin_offset = mapped if self.twins else 0
        self.batch = LlamaBatch(llama, int(llama.llama_n_batch(self.ctx)), twin_offset)
        self._logits = np.zeros((self.max_outputs, self.n_vocab), dtype=np.float32)
        max_len = min(args.context_length or self.config.max_position_embeddings, self.kv_capacity)
        memory = TwinnedMemory(self, twin_offset) if self.twins else self
        self.seqs = SeqMap(memory, self.kv_capacity + 1, mapped, max_len + 2)
        self.states: LlamaStates | None = None
        if self.recurrent:
            budget = snapshot_budget(args.snapshot_mib)
            self.states = LlamaStates(llama, self.ctx, self.seqs, budget)
            self.snapshots = self.states
        self.kv_transfer = self._kv_transfer() if self.tiers_kv else None
        logger.info(
            "llama.cpp: %s, %d threads, %d sequence ids; keeps at most %d idle cached tokens "
            "(--max-cached-tokens)",
            _describe(llama, self.model),
            self.threads,
            self.n_seq,
            self.idle_cache_budget,
        )
        logger.info(self.kv_budget.describe())

    # ---- ModelRunner ---------------------------------------------------------------------

    def forward(self, batch: ForwardBatch, sampling: SamplingBatch) -> SampleOutput:
        seqs = self._sequences(batch)
        outputs = batch.logit_index
        self.batch.fill(
            batch.input_ids, batch.positions, np.repeat(seqs, batch.extend_lens), outputs
        )
        rc = self.llama.llama_decode(self.ctx, self.batch.struct)
        if rc != 0:
            raise RuntimeError(
                f"llama_decode returned {rc} for {batch.num_tokens} tokens of "
                f"{batch.num_reqs} requests ({self.seqs.live_cells} of {self.kv_capacity} "
                "cells in use): the KV accounting and llama.cpp's cells disagree"
            )
        for i, seq in enumerate(seqs):
            new = slice(batch.qo_indptr[i], batch.qo_indptr[i + 1])
            self.seqs.written(seq, batch.positions[new], batch.out_slots[new])
        return self._sample(self._logit_rows(outputs), sampling)

    def bind_kv(self, pool: KVPool, evict: Callable[[int], int]) -> None:
        pool.add_free_listener(self.seqs.release)
        self.seqs.set_evictor(evict)

    def check_kv(self, pool: KVPool) -> None:
        allocated = np.setdiff1d(np.arange(1, pool.num_slots), pool.free_slots())
        self.seqs.check(allocated)
        if self.tiers_kv and self._pos_max(self.n_seq - 1) >= 0:
            raise AssertionError("the cache tiers' spare sequence still holds cells")
        for seq in range(self.seqs.n_seq):
            held = np.flatnonzero(self.seqs.paths[seq] >= 0)
            lo, hi = (int(held[0]), int(held[-1])) if held.size else (-1, -1)
            # Models with recurrent state report the span that cells and state share, and
            # when idle every state is moot: `LlamaStates.apply_pending` checks each restore.
            got = (self._pos_min(seq), self._pos_max(seq))
            if self.states is None and got != (lo, hi):
                raise AssertionError(f"sequence {seq}: llama.cpp holds {got}, the map ({lo}, {hi})")
            twin = seq + self.batch.twin_offset
            if self.twins and (self._pos_min(twin), self._pos_max(twin)) != got:
                raise AssertionError(f"sequence {seq}'s twin holds other cells than {got}")

    def close(self) -> None:
        """Free llama.cpp's context and model (the KV cache and weights' buffers)."""
        ctx, model, self.ctx, self.model = getattr(self, "ctx", None), self.model, None, None
        if ctx:
            self.llama.llama_free(ctx)
        if model:
            self.llama.llama_model_free(model)

    def __del__(self) -> None:
        if getattr(self, "model", None) is not None:
            self.close()

    # ---- SeqMemory (what SeqMap calls) -----------------------------------------------------

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        if self.states is None or p0 < 0 and p1 < 0:  # a whole sequence goes, state and all
            self._seq_rm(seq, p0, p1)
            return
        with self.states.kept(seq):
            self._seq_rm(seq, p0, p1)

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        if self.states is None:
            self.llama.llama_memory_seq_cp(self.memory, src, dst, p0, p1)
            return
        with self.states.kept(dst):
            self.llama.llama_memory_seq_cp(self.memory, src, dst, p0, p1)

    def _seq_rm(self, seq: int, p0: int, p1: int) -> None:
        if not self.llama.llama_memory_seq_rm(self.memory, seq, p0, p1):
            raise RuntimeError(f"llama.cpp refused to drop positions [{p0}, {p1}) of {seq}")

    # ---- internals -------------------------------------------------------------------------

    def _sequences(self, batch: ForwardBatch) -> np.ndarray:
        if batch.req_rows is None:
            raise ValueError("the llamacpp runner needs each request's row (ForwardBatch.req_rows)")
        seqs = np.empty(batch.num_reqs, dtype=np.int32)
        prefixes = batch.prefix_lens
        for i in range(batch.num_reqs):
            table = batch.kv_indices[batch.kv_indptr[i] : batch.kv_indptr[i + 1]]
            row = int(batch.req_rows[i])
            seqs[i] = self.seqs.sequence_for(row, table, int(prefixes[i]))
            if self.states is not None:
                self.states.apply_pending(row, int(seqs[i]), int(prefixes[i]))
        return seqs

    def _kv_transfer(self) -> LlamaKVTransfer | None:
        """Cells to host bytes and back for the cache tiers, the layout learned from a blob
        of one probe token (None, and the tiers stay off, if llama.cpp's differs); a hybrid's
        blob ends in its recurrent part, the empty state's for the spare sequence (`tail`)."""
        scratch, llama = self.n_seq - 1, self.llama
        if self.states is not None and not llama.llama_model_is_hybrid(self.model):
            return LlamaKVTransfer(llama, self.ctx, self.seqs, scratch, None)  # no cells
        tail = bytes(self.states.empty)[8:] if self.states is not None else b""  # (past magic, id)
        one = np.zeros(1, dtype=np.int64)
        self.batch.fill(one, one, np.full(1, scratch), one, twinned=False)
        if llama.llama_decode(self.ctx, self.batch.struct) != 0:
            return None
        try:
            if self.states is not None:  # the probe token's state goes: the tail is the empty one
                self.states.clear(scratch)
            blob = save_state(llama, self.ctx, scratch)
            if bytes(blob[len(blob) - len(tail) :]) != tail:
                raise BlobError("a hybrid blob that does not end in its recurrent part")
            layout = CellLayout.learn(blob[: len(blob) - len(tail)])
        except BlobError as exc:
            logger.info("llama.cpp's KV state cannot go to the cache tiers: %s", exc)
            return None
        finally:
            self._seq_rm(scratch, -1, -1)
        return LlamaKVTransfer(llama, self.ctx, self.seqs, scratch, layout, tail, self.window)

    def _logit_rows(self, outputs: np.ndarray) -> Any:
        import torch

        rows = self._logits[: len(outputs)]
        for i, index in enumerate(outputs):
            ptr = self.llama.llama_get_logits_ith(self.ctx, int(index))
            rows[i] = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
        return torch.from_numpy(rows)  # a view: the sampler reads the rows where they are

    def _pos_min(self, seq: int) -> int:
        return int(self.llama.llama_memory_seq_pos_min(self.memory, seq))

    def _pos_max(self, seq: int) -> int:
        return int(self.llama.llama_memory_seq_pos_max(self.memory, seq))

    def _kv_budget(self, args: RunnerConfig, dtype: str) -> KVBudget:
        """llama.cpp's cells, sized as every backend sizes its pool (see `kv_budget`)."""
        context_len = args.context_length or self.config.max_position_embeddings
        available = int(psutil.virtual_memory().available)
        return plan_kv_budget(args, KVLayout.for_model(self.config, dtype), context_len, available)

    def _idle_cache_budget(self) -> int:
        """Idle cached cells whose attention scan costs ~1/4 of a step's matmuls (see
        IDLE_CELLS_PER_WORK): more would slow every request more than reuse can repay."""
        c = self.config
        work = 2 * int(self.llama.llama_model_n_params(self.model))
        cells = work / max(c.num_attention_heads * c.num_hidden_layers, 1) * IDLE_CELLS_PER_WORK
        return min(self.kv_capacity, max(1024, round(cells)))

    def _context_params(self, args: RunnerConfig, target: Target, max_batch: int) -> Any:
        params = self.llama.llama_context_default_params()
        params.n_ctx = self.kv_capacity
        params.n_batch = max_batch
        params.n_ubatch = min(UBATCH, max_batch)
        params.n_seq_max = self.n_seq
        params.n_outputs_max = max(self.n_seq, self.max_outputs)  # logits rows per step
        params.n_threads = params.n_threads_batch = self.threads
        params.flash_attn_type = FLASH_ATTN_ENABLED
        params.type_k = params.type_v = KV_TYPES[target.dtype]
        params.kv_unified = True
        params.swa_full = True  # sliding-window models keep old prefixes reusable
        params.no_perf = True
        return params


def _load_model(llama: Any, path: Path, gpu: bool) -> Any:
    params = llama.llama_model_default_params()
    params.n_gpu_layers = -1 if gpu else 0
    model = llama.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise ValueError(f"llama.cpp could not load {path} (see the log above)")
    return model


def _new_context(llama: Any, model: Any, params: Any) -> Any:
    ctx = llama.llama_init_from_model(model, params)
    if not ctx:
        raise RuntimeError(
            f"llama.cpp could not create a context of {params.n_ctx} cells "
            "(lower --max-total-tokens)"
        )
    return ctx


def _config(llama: Any, model: Any, recurrent_path: Path | None) -> ModelConfig:
    """What the engine needs to know of the model, from llama.cpp (any architecture); for a
    model with recurrent layers, which layers keep KV, from the file's metadata (read only
    then: the header holds the whole vocabulary)."""
    from localradix.gguf_file import read_gguf
    from localradix.loader.gguf_config import gguf_model_config

    kv_layers = None
    if recurrent_path is not None:
        kv_layers = gguf_model_config(read_gguf(recurrent_path, tensors=False).metadata).kv_layers
    vocab = llama.llama_model_get_vocab(model)
    arch = _meta(llama, model, "general.architecture") or "unknown"
    heads = int(llama.llama_model_n_head(model))
    hidden = int(llama.llama_model_n_embd(model))
    head_dim = _meta(llama, model, f"{arch}.attention.key_length")
    eos = {int(llama.llama_vocab_eos(vocab)), int(llama.llama_vocab_eot(vocab))} - {-1}
    bos = int(llama.llama_vocab_bos(vocab))
    return ModelConfig(
        architecture=arch,
        model_type=arch,
        vocab_size=int(llama.llama_vocab_n_tokens(vocab)),
        hidden_size=hidden,
        intermediate_size=0,
        num_hidden_layers=int(llama.llama_model_n_layer(model)),
        num_attention_heads=heads,
        # Pure recurrent models have no KV heads: one stands in, so sizing never divides by 0.
        num_key_value_heads=max(int(llama.llama_model_n_head_kv(model)), 1),
        head_dim=int(head_dim) if head_dim else hidden // max(heads, 1),
        max_position_embeddings=int(llama.llama_model_n_ctx_train(model)),
        bos_token_id=None if bos < 0 else bos,
        eos_token_ids=tuple(sorted(eos)),
        kv_layers=kv_layers,
    )


def _meta(llama: Any, model: Any, key: str) -> str | None:
    buf = ctypes.create_string_buffer(256)
    n = llama.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode("utf-8", "replace") if n >= 0 else None


def _describe(llama: Any, model: Any) -> str:
    """E.g. "llama ?B Q4_1" (llama.cpp's own one-line description)."""
    buf = ctypes.create_string_buffer(256)
    llama.llama_model_desc(model, buf, len(buf))
    return buf.value.decode("utf-8", "replace")


def _one_torch_thread() -> None:
    """Torch only samples here (one row per request); its OpenMP threads would spin on the
    cores llama.cpp's threads need (measured: ~25% slower decode with torch's default)."""
    import torch

    torch.set_num_threads(1)


def _quiet_llama(level: str) -> None:
    """llama.cpp's own log goes to stderr through llama-cpp-python: errors only unless debug."""
    logging.getLogger("llama-cpp-python").setLevel(
        logging.DEBUG if level == "debug" else logging.ERROR
    )
