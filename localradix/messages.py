"""Plain messages between a front end and the engine loop (pickled over ZMQ by the server).

Requests go in (`EngineRequest`), events come out (`EngineEvent`); the in-process `Engine`
uses the same messages over queues, so both paths share one protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from localradix.sampling_params import SamplingParams


class ErrorCode(str, Enum):
    """Why the engine ended a request with finish_reason "error" (the message says the rest)."""

    INVALID_REQUEST = "invalid_request"  # the engine cannot take it: lengths, token ids, ...
    INVALID_CONSTRAINT = "invalid_constraint"  # the output constraint does not compile
    ENGINE_FAILURE = "engine_failure"  # the engine failed it (its loop crashed, or a fault)
    PREFIX_EVICTED = "prefix_evicted"  # `require_cached_tokens` were no longer cached


@dataclass(frozen=True)
class CachePin:
    """Keep the prompt's first `tokens` tokens cached (never evicted) for `ttl_s` seconds from
    the request that set it (Anthropic `cache_control`); pinning the same prefix again renews it."""

    tokens: int
    ttl_s: float


@dataclass(frozen=True)
class Embed:
    """Prefill only and return the pooled last hidden state instead of generating."""

    pooling: str = "last"  # "last" (the last token's state) | "mean" (over the prompt)
    normalize: bool = True  # L2-normalise the vector


@dataclass(frozen=True)
class GenerateRequest:
    rid: str
    input_ids: tuple[int, ...]
    params: SamplingParams
    extra_key: str | None = None  # radix-cache namespace (tenant / LoRA salt)
    pins: tuple[CachePin, ...] = ()  # prefixes to keep cached after this request
    # The first N prompt tokens must already be cached (a continuation served from the radix
    # cache, e.g. Responses' previous_response_id); else the request ends with PREFIX_EVICTED.
    require_cached_tokens: int = 0
    embed: Embed | None = None  # an embedding request (prefill only)


@dataclass(frozen=True)
class AbortRequest:
    rid: str


@dataclass(frozen=True)
class FlushCache:
    """Drop every unlocked cached prefix; refused while requests run."""


@dataclass(frozen=True)
class Shutdown:
    """Stop the engine loop (the API process aborts its requests first)."""


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob) alternatives, best first


@dataclass(frozen=True)
class RequestOutput:
    """New tokens of one request since its last output; the last one has `finished` set."""

    rid: str
    new_token_ids: tuple[int, ...]
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    matched_stop: int | str | None = None  # the stop token id or stop string that ended it
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    logprobs: tuple[TokenLogprob, ...] = ()
    error: str | None = None
    error_code: ErrorCode | None = None  # set whenever `error` is
    embedding: tuple[float, ...] | None = None  # the answer to an `embed` request


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine for /metrics, the stats feed and the TUI."""

    running: int = 0
    queued: int = 0
    kv_total: int = 0
    kv_used: int = 0  # held by running requests (protected)
    kv_cached: int = 0  # cached and evictable
    kv_free: int = 0
    cache_hit_tokens: int = 0
    cache_miss_tokens: int = 0
    prompt_tokens_total: int = 0
    generated_tokens_total: int = 0
    retractions: int = 0
    # Speculative decoding: request-steps that verified drafts, drafts sent, drafts accepted.
    spec_verify_steps: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    prefill_tokens_per_s: float = 0.0
    decode_tokens_per_s: float = 0.0
    requests: tuple[dict, ...] = field(default=())  # per running request: id, state, counts
    top_prefixes: tuple[dict, ...] = field(default=())  # largest cached prefixes
    recent_misses: tuple[dict, ...] = field(default=())  # where recent prompts diverged
    kv_pinned: int = 0  # of kv_used: cached tokens pinned by cache_control (even when idle)
    # Models with recurrent layers: state snapshots kept at radix nodes, their bytes, and the
    # requests that resumed from one (sched/slot_handoff.py).
    snapshots: int = 0
    snapshot_bytes: int = 0
    snapshot_hits: int = 0
    snapshot_miss_tokens: int = 0  # cached prompt tokens past a request's last snapshot
    # The tiers below the tree (host memory, disk): `KVTiers.stats()`; empty when off.
    kv_tiers: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelInfo:
    name: str  # the id the API serves it as
    path: str
    context_length: int
    vocab_size: int
    backend: str
    device: str
    dtype: str
    kv_total_tokens: int
    architecture: str = ""
    weight_bytes: int | None = None  # resident weights (quantized ones packed); None: unknown
    kv_bytes: int | None = None  # what the KV pool reserves; None: unknown
    pooling: str | None = None  # how the model embeds ("last" | "mean"); None: it cannot
    embed_normalize: bool = True  # whether its embeddings are L2-normalised (with `pooling`)


# ---- what the engine loop sends back (besides EngineStats snapshots) ------------------------


@dataclass(frozen=True)
class Ready:
    """The core is built: sent once, first."""

    info: ModelInfo


@dataclass(frozen=True)
class LoadFailed:
    """The core could not be built (sent instead of Ready; the loop then ends)."""

    message: str


@dataclass(frozen=True)
class StepOutputs:
    """What one engine step produced (only steps that produced something are sent)."""

    outputs: list[RequestOutput]


@dataclass(frozen=True)
class FlushDone:
    """The answer to FlushCache: False while requests run."""

    flushed: bool


@dataclass(frozen=True)
class Fatal:
    """The loop crashed (a bug or a device error): the last line of its traceback."""

    message: str


EngineRequest = GenerateRequest | AbortRequest | FlushCache | Shutdown
EngineEvent = Ready | LoadFailed | StepOutputs | EngineStats | FlushDone | Fatal
