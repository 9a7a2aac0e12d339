"""Embeddings, the part every dialect shares: is the served model an embedding model, its
inputs as token ids (within the engine's limits, or cut to fit when asked), and the vectors.

The inputs run as one job of prefill-only engine requests (`Embed`), batched with whatever
else runs; each vector comes back pooled and normalised as the model says
(`ModelInfo.pooling`, `embed_normalize`).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from litestar import Request

from localradix.engine.tracker import EMBED_PARAMS
from localradix.messages import Embed
from localradix.server.core.gather import gather
from localradix.server.core.jobs import LONG_TEXT_CHARS, MAX_PROMPTS
from localradix.server.errors import APIError, bad_request
from localradix.server.tokenizer_manager import TokenizerManager

# Said to a client that asks a generation model for embeddings.
EMBEDDING_MODELS = "an embedding model such as Qwen3-Embedding (e.g. Qwen/Qwen3-Embedding-0.6B)"


def model_embed(manager: TokenizerManager, param: str = "model") -> Embed:
    """How the served model embeds; a 400 naming an embedding model family if it cannot."""
    info = manager.client.loaded
    if info.pooling is None:
        raise bad_request(
            f"'{info.name}' cannot embed: it is a text generation model without an embedding "
            f"pooling (or runs on a backend that cannot return hidden states); serve "
            f"{EMBEDDING_MODELS} with the torch or MLX backend to use embeddings",
            param,
            "model_not_embedding",
        )
    return Embed(info.pooling, info.embed_normalize)


async def input_ids(
    manager: TokenizerManager, inputs: Sequence[str | Sequence[int]], param: str, truncate: bool
) -> list[list[int]]:
    """Each input as token ids (text with the tokenizer's special tokens, as
    sentence-transformers tokenizes); too long is a 400 naming `param`, or cut when `truncate`."""
    if not inputs:
        raise bad_request(f"'{param}' is empty", param)
    if len(inputs) > MAX_PROMPTS * 32:
        raise bad_request(f"at most {MAX_PROMPTS * 32} inputs per request", param)
    out = []
    for item in inputs:
        ids = await _encode(manager, item) if isinstance(item, str) else [int(t) for t in item]
        if truncate:
            ids = ids[: _room(manager)]
        manager.check_prompt(ids, param)
        out.append(ids)
    return out


@dataclass(frozen=True)
class Embedded:
    vectors: list[list[float]]
    prompt_tokens: int
    seconds: float  # from submission to the last vector


async def embed(
    request: Request[Any, Any, Any], manager: TokenizerManager, prompts: list[list[int]], how: Embed
) -> Embedded | None:
    """The vectors of `prompts` (None, and the job aborted, if the client leaves first)."""
    job = manager.submit(prompts, EMBED_PARAMS, embed=how)
    gathered = await gather(request, job)
    if gathered is None:
        return None
    vectors = [list(c.final.embedding) for c in job.choices if c.final and c.final.embedding]
    if len(vectors) != len(prompts):  # aborted in the engine (it is shutting down)
        raise APIError(503, "the engine ended an embedding request early; retry")
    seconds = time.monotonic() - job.start
    return Embedded(vectors, sum(map(len, prompts)), seconds)


def shortened(
    vector: list[float], dimensions: int | None, param: str = "dimensions"
) -> list[float]:
    """The first `dimensions` values, renormalised to unit length (Matryoshka embeddings); a
    400 if the model's vectors are shorter."""
    if dimensions is None or dimensions == len(vector):
        return vector
    if dimensions < 1 or dimensions > len(vector):
        raise bad_request(
            f"'{param}' must be between 1 and the model's {len(vector)} dimensions", param
        )
    head = vector[:dimensions]
    norm = math.sqrt(sum(x * x for x in head)) or 1.0
    return [x / norm for x in head]


def _room(manager: TokenizerManager) -> int:
    """The longest prompt the engine takes."""
    limits = manager.limits
    room = limits.context_length - 1
    return min(room, limits.kv_total_tokens - 1) if limits.kv_total_tokens else room


async def _encode(manager: TokenizerManager, text: str) -> list[int]:
    if len(text) > LONG_TEXT_CHARS:
        return await asyncio.to_thread(manager.tokenizer.encode, text, True)
    return list(manager.tokenizer.encode(text, True))
