"""ForwardBatch: the plan the scheduler hands a model runner for one step.

Plain numpy arrays only, so any backend (torch, MLX, FlashInfer) can consume it. The layout is
FlashInfer's ragged/paged one: request i owns new tokens `qo_indptr[i]:qo_indptr[i+1]` of the
flat token arrays and KV slots `kv_indices[kv_indptr[i]:kv_indptr[i+1]]` (prefix + new tokens,
in sequence order). Decode requests are simply extends of length 1. `req_rows` names each
request's row in the request table: a stable identity while it runs, for runners that keep
per-request state (llama.cpp's sequence ids). `num_sampled` says how many of each request's
last positions are sampled (a speculative verify samples every draft position; None = 1 each):
the runner returns one token per row of `logit_index`. `pooling` marks the prefill chunks of
embedding requests: the runner also returns their pooled final hidden states.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ForwardBatch:
    input_ids: np.ndarray  # int64 [num_tokens]: new tokens of every request, concatenated
    positions: np.ndarray  # int64 [num_tokens]: position of each new token in its sequence
    out_slots: np.ndarray  # int64 [num_tokens]: KV slot each new token's K/V is written to
    qo_indptr: np.ndarray  # int64 [num_reqs + 1]: offsets of each request's new tokens
    kv_indptr: np.ndarray  # int64 [num_reqs + 1]: offsets into kv_indices
    kv_indices: np.ndarray  # int64 [sum(seq_lens)]: each request's slots, prefix then new
    seq_lens: np.ndarray  # int64 [num_reqs]: total length after this step
    extend_lens: np.ndarray  # int64 [num_reqs]: new tokens this step (1 for decode)
    req_rows: np.ndarray | None = None  # int64 [num_reqs]: request-table row of each request
    num_sampled: np.ndarray | None = None  # int64 [num_reqs]: positions sampled; None = 1 each
    # Per request: "" (no embedding), "last" (its last new token's hidden state) or "mean"
    # (the sum over its new tokens; the scheduler divides once every chunk is in). None: all "".
    pooling: tuple[str, ...] | None = None

    @property
    def num_reqs(self) -> int:
        return len(self.seq_lens)

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def prefix_lens(self) -> np.ndarray:
        return self.seq_lens - self.extend_lens

    @property
    def is_decode_only(self) -> bool:
        return bool(np.all(self.extend_lens == 1))

    @property
    def last_token_index(self) -> np.ndarray:
        """Index (into the flat token arrays) of each request's last new token."""
        return self.qo_indptr[1:] - 1

    @property
    def num_rows(self) -> int:
        """Sampled rows: one per request, or `num_sampled` of each."""
        return self.num_reqs if self.num_sampled is None else int(self.num_sampled.sum())

    @property
    def logit_index(self) -> np.ndarray:
        """Index (into the flat token arrays) of every sampled position: the last
        `num_sampled[i]` new tokens of request i, in order. These are the logits rows."""
        ends = self.qo_indptr[1:]
        if self.num_sampled is None:
            return ends - 1
        n = self.num_sampled
        starts = np.repeat(ends - n, n)
        within = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
        return starts + within

    @property
    def last_row(self) -> np.ndarray:
        """Each request's last sampled row (index into `logit_index` and the sampled tokens)."""
        n = np.ones(self.num_reqs, dtype=np.int64) if self.num_sampled is None else self.num_sampled
        return np.cumsum(n) - 1

    @staticmethod
    def build(
        input_ids: list[np.ndarray],
        slot_tables: list[np.ndarray],
        prefix_lens: list[int],
        req_rows: list[int] | None = None,
        num_sampled: list[int] | None = None,
        pooling: list[str] | None = None,
    ) -> ForwardBatch:
        """Assemble from per-request new tokens, full slot tables (prefix + new), prefix lengths
        and (optionally) each request's row in the request table and sampled positions."""
        extend = np.array([len(t) for t in input_ids], dtype=np.int64)
        seq = np.array([len(s) for s in slot_tables], dtype=np.int64)
        prefix = np.asarray(prefix_lens, dtype=np.int64)
        assert np.all(prefix + extend == seq), "slot table must cover prefix + new tokens"
        positions = np.concatenate([np.arange(p, s, dtype=np.int64) for p, s in zip(prefix, seq)])
        out_slots = np.concatenate([s[p:] for s, p in zip(slot_tables, prefix)]).astype(np.int64)
        return ForwardBatch(
            input_ids=np.concatenate(input_ids).astype(np.int64),
            positions=positions,
            out_slots=out_slots,
            qo_indptr=_indptr(extend),
            kv_indptr=_indptr(seq),
            kv_indices=np.concatenate(slot_tables).astype(np.int64),
            seq_lens=seq,
            extend_lens=extend,
            req_rows=None if req_rows is None else np.asarray(req_rows, dtype=np.int64),
            num_sampled=_sampled(num_sampled, extend),
            pooling=tuple(pooling) if pooling and any(pooling) else None,
        )


def _sampled(num_sampled: list[int] | None, extend: np.ndarray) -> np.ndarray | None:
    """None when every request samples one position (the common case runners fast-path)."""
    if num_sampled is None or all(n == 1 for n in num_sampled):
        return None
    n = np.asarray(num_sampled, dtype=np.int64)
    assert np.all((n >= 1) & (n <= extend)), "a request samples 1..extend_len positions"
    return n


def _indptr(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out
