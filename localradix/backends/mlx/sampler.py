"""Batched sampling in MLX, with the torch sampler's exact semantics (runner/sampler.py).

Penalties (repetition: Hugging Face, over every token seen; frequency/presence: OpenAI, over
generated tokens), the grammar's allowed-token bitmask, temperature, top-k / top-p / min-p on the descending-sorted distribution,
and inverse-CDF picking from one uniform draw per request, so a seeded request gives the same
tokens alone, batched, and on either backend.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from localradix.step import SampleOutput, SamplingBatch


def sample(logits: mx.array, sb: SamplingBatch) -> SampleOutput:
    """logits: float32 [B, V] (one row per request) -> chosen tokens (+ logprobs if asked)."""
    if sb.any_penalty:
        logits = apply_penalties(logits, sb)
    vocab_mask = getattr(sb, "vocab_mask", None)
    if vocab_mask is not None:
        logits = apply_vocab_mask(logits, vocab_mask)
    if sb.all_greedy:
        tokens = mx.argmax(logits, axis=-1)
    else:
        tokens = _sample_random(logits, sb)
    return _with_logprobs(logits, tokens, sb)


def apply_penalties(logits: mx.array, sb: SamplingBatch) -> mx.array:
    batch, vocab = logits.shape
    seen = np.zeros((batch, vocab), dtype=bool)  # tokens the repetition penalty applies to
    counts = np.zeros((batch, vocab), dtype=np.float32)  # generated-token counts
    for i, hist in enumerate(sb.history):
        if hist is None:
            continue
        ids, n_prompt = hist
        if float(sb.repetition_penalty[i]) != 1.0:
            seen[i, np.unique(ids)] = True
        counts[i] = np.bincount(ids[n_prompt:], minlength=vocab)[:vocab]
    rep = mx.array(sb.repetition_penalty)[:, None]
    logits = mx.where(mx.array(seen), mx.where(logits > 0, logits / rep, logits * rep), logits)
    c = mx.array(counts)
    logits = logits - mx.array(sb.frequency_penalty)[:, None] * c
    return logits - mx.array(sb.presence_penalty)[:, None] * (c > 0).astype(logits.dtype)


def apply_vocab_mask(logits: mx.array, mask: np.ndarray) -> mx.array:
    """Disallow (-inf) every token whose bit is clear in the int32 bitmask [B, ceil(V / 32)]."""
    words = mx.array(np.ascontiguousarray(mask, dtype=np.int32))
    shifts = mx.arange(32, dtype=mx.int32)
    bits = (words[:, :, None] >> shifts) & 1  # [B, W, 32], bit j of word w = token 32 w + j
    allowed = bits.reshape(words.shape[0], -1)[:, : logits.shape[1]].astype(mx.bool_)
    return mx.where(allowed, logits, mx.array(-np.inf, dtype=logits.dtype))


def _sample_random(logits: mx.array, sb: SamplingBatch) -> mx.array:
    temperature = mx.array(sb.temperature)
    greedy = temperature == 0
    scaled = logits / mx.where(greedy, mx.ones_like(temperature), temperature)[:, None]
    probs = mx.softmax(scaled, axis=-1, precise=True)
    if _needs_filter(sb):
        # Filter on the sorted distribution, pick in vocabulary order (as the torch sampler):
        # a seeded row's token must not depend on whether a batch mate filters.
        order = mx.argsort(-probs, axis=-1)
        cut_sorted = _filter_mask(mx.take_along_axis(probs, order, axis=-1), sb)
        cut = mx.take_along_axis(cut_sorted, mx.argsort(order, axis=-1), axis=-1)
        probs = mx.where(cut, mx.zeros_like(probs), probs)
    cdf = mx.cumsum(probs, axis=-1)
    u = mx.array(sb.uniform.astype(np.float32))
    target = (u * cdf[:, -1])[:, None]
    pos = mx.sum(cdf <= target, axis=-1, keepdims=True)  # searchsorted(right=True)
    # u * total can round up to the total: stay on the last token that can be drawn.
    vocab = probs.shape[1]
    last = vocab - 1 - mx.argmax((probs[:, ::-1] > 0).astype(mx.int32), axis=-1, keepdims=True)
    picked = mx.minimum(pos, last)
    return mx.where(greedy, mx.argmax(logits, axis=-1), picked[:, 0])


def _needs_filter(sb: SamplingBatch) -> bool:
    return bool((sb.top_p < 1).any() or (sb.min_p > 0).any() or (sb.top_k > 0).any())


def _filter_mask(sorted_probs: mx.array, sb: SamplingBatch) -> mx.array:
    """True where a (descending-sorted) token is cut by top-k, top-p or min-p."""
    vocab = sorted_probs.shape[1]
    top_k = mx.array(np.where(sb.top_k > 0, sb.top_k, vocab).astype(np.int32))
    top_p = mx.array(sb.top_p)
    min_p = mx.array(sb.min_p)
    rank = mx.arange(vocab)[None, :]
    mask = rank >= top_k[:, None]
    mask = mask | ((mx.cumsum(sorted_probs, axis=-1) - sorted_probs) > top_p[:, None])
    mask = mask | (sorted_probs < (min_p * sorted_probs[:, 0])[:, None])
    return mask & (rank > 0)  # the most likely token always survives


def _with_logprobs(logits: mx.array, tokens: mx.array, sb: SamplingBatch) -> SampleOutput:
    k = sb.max_logprobs
    if k < 0:
        return SampleOutput(np.array(tokens).astype(np.int64))
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    chosen = mx.take_along_axis(logprobs, tokens[:, None], axis=-1)[:, 0]
    if k == 0:
        mx.eval(tokens, chosen)
        return SampleOutput(np.array(tokens).astype(np.int64), np.array(chosen))
    top_ids = mx.argsort(-logprobs, axis=-1)[:, :k]
    top_lp = mx.take_along_axis(logprobs, top_ids, axis=-1)
    mx.eval(tokens, chosen, top_ids, top_lp)
    return SampleOutput(
        np.array(tokens).astype(np.int64),
        np.array(chosen),
        np.array(top_ids).astype(np.int64),
        np.array(top_lp),
    )
