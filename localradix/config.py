"""All of localradix's settings in one frozen dataclass: the feature inventory.

The CLI flags are generated from the fields below, so a flag and its default live in exactly one
place. This module imports nothing heavy (no torch), so `localradix --help` stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any

SCHEDULE_POLICIES = ("lpm", "fcfs", "dfs-weight")
EVICTION_POLICIES = ("lru", "lfu", "fifo", "priority")
DTYPES = ("auto", "float32", "bfloat16", "float16")
AUTO_ON_OFF = ("auto", "on", "off")
ATTENTIONS = ("auto", "flashinfer", "triton", "torch_native")
QUANTIZE = ("auto", "off", "2", "3", "4", "5", "6", "8", "mxfp4", "mxfp8")
# smg's routing policies that need nothing but worker URLs (see `smg launch --help`).
ROUTER_POLICIES = (
    "cache_aware",
    "round_robin",
    "power_of_two",
    "least_load",
    "prefix_hash",
    "consistent_hashing",
    "random",
)


def _opt(help: str, **kw: Any) -> Any:
    """A dataclass field carrying its CLI help text (and optional argparse `choices`)."""
    default = kw.pop("default")
    return field(default=default, metadata={"help": help, **kw})


@dataclass(frozen=True)
class ServerArgs:
    # Model
    model: str | None = _opt(
        "GGUF file or Hugging Face folder; omitted = the bundled SmolLM2-135M-Instruct",
        default=None,
    )
    served_model_name: str | None = _opt("model id reported by the API", default=None)
    context_length: int | None = _opt("override the model's context length", default=None)
    # Hardware
    backend: str = _opt("runner backend: auto, cpu, cuda, rocm, mlx, npu, llamacpp", default="auto")
    device: str | None = _opt("torch device string (default: the backend's own)", default=None)
    dtype: str = _opt(
        "weight and activation dtype (llamacpp: the KV cache's; weights stay as stored). Torch "
        "runners keep the KV cache in bfloat16 when auto resolves to float32",
        default="auto",
        choices=DTYPES,
    )
    quantize: str = _opt(
        "MLX backend (other backends refuse a width): quantize the float weight matrices at "
        "load to N-bit affine (group 64) or mxfp4/mxfp8. Quantized checkpoints (MLX folders; GGUF Q4_0/Q4_1/Q8_0) always stay as "
        "stored; other GGUF quantized types are re-quantized to the nearest MLX width (auto), "
        "to this one, or kept float16 (off)",
        default="auto",
        choices=QUANTIZE,
    )
    threads: int | None = _opt(
        "CPU threads for the llamacpp backend (default: the physical core count)", default=None
    )
    tp: int = _opt(
        "tensor parallelism: split the model over N ranks (N GPUs with --backend cuda, N "
        "processes on the CPU); torch backends and Hugging Face safetensors folders only",
        default=1,
    )
    # Memory
    max_total_tokens: int | None = _opt(
        "KV pool size in tokens (default: 4 x the context length, at least 16,384, within "
        "--mem-fraction of free memory; the log and `localradix doctor` say what was reserved)",
        default=None,
    )
    mem_fraction: float = _opt("most of the free memory the default KV pool takes", default=0.25)
    page_size: int = _opt("tokens per KV page", default=1)
    attention: str = _opt(
        "attention kernels of the torch backends: auto (on a GPU FlashInfer where installed, "
        "else Triton, else torch-native; on a CPU torch-native), or one by name (triton on a "
        "CPU runs in Triton's interpreter: for testing the kernels, slow)",
        default="auto",
        choices=ATTENTIONS,
    )
    # Scheduling and caching
    schedule_policy: str = _opt("waiting-queue order", default="lpm", choices=SCHEDULE_POLICIES)
    eviction_policy: str = _opt(
        "radix-cache eviction policy", default="lru", choices=EVICTION_POLICIES
    )
    disable_radix_cache: bool = _opt("never reuse a cached prefix", default=False)
    snapshot_mib: float | None = _opt(
        "MiB of recurrent-state snapshots kept at cached prefixes (models with recurrent "
        "layers: Qwen3.5, Granite 4 hybrids, LFM2, Mamba; LRU beyond that). Default: a quarter "
        "of the free memory at start, at most 8 GiB",
        default=None,
    )
    max_cached_tokens: int | None = _opt(
        "most tokens the radix cache keeps that no running request uses (LRU beyond that), "
        "enforced while requests run. Default: all that fit in the pool; on llamacpp, where "
        "every cached cell costs attention time in every step, a bound from the model's size "
        "(logged at start; about 4k tokens for a 135M model, 64k for an 8B one)",
        default=None,
    )
    kv_disk_cache: str | None = _opt(
        "folder of the prefix cache's disk tier: KV the pool evicts, and everything cached at "
        "a graceful stop, is kept there across restarts and model unloads, per model (torch, "
        "MLX and llama.cpp backends). Default: $LOCALRADIX_KV_DISK_CACHE, else ~/.cache/localradix/kv; 'off' "
        "turns it off. `localradix cache` shows and clears it",
        default=None,
    )
    kv_disk_gib: float | None = _opt(
        "most GiB the disk tier keeps, every model's together (the least recently used go "
        "first). Default: $LOCALRADIX_KV_DISK_GIB, else a tenth of the disk's free space, at "
        "most 16",
        default=None,
    )
    kv_host_gib: float = _opt(
        "GiB of host memory holding KV the device's pool evicts, before it goes to disk (for "
        "GPU backends, where host RAM is the larger; 0 = none)",
        default=0.0,
    )
    chunked_prefill_size: int = _opt(
        "longest prefill chunk in tokens (0 = never chunk)", default=2048
    )
    max_prefill_tokens: int = _opt("token budget of one prefill batch", default=8192)
    step_budget_ms: float = _opt(
        "the time one prefill step should take, so requests that arrive during a long "
        "prompt's prefill wait at most about this long: its chunks are sized from the measured "
        "prefill speed, up to --chunked-prefill-size, and new short requests go first (0 = "
        "fixed chunks)",
        default=1000.0,
    )
    max_running_requests: int = _opt("most requests decoding at once", default=64)
    max_queued_requests: int = _opt("waiting requests before new ones get 429", default=1024)
    new_token_ratio: float = _opt(
        "share of max_tokens reserved for running requests at admission", default=0.7
    )
    overlap_schedule: str = _opt(
        "prepare the next batch while the device runs this one: auto (on for GPU/NPU torch "
        "runners), on, off",
        default="auto",
        choices=AUTO_ON_OFF,
    )
    mixed_prefill: str = _opt(
        "run the decoding requests in the same step as a prefill instead of pausing them: "
        "auto (on for the llamacpp backend, where a step's cost hardly grows with a few more "
        "tokens), on, off",
        default="auto",
        choices=AUTO_ON_OFF,
    )
    decode_log_interval: int = _opt("log a decode line every N steps", default=40)
    speculative: str | None = _opt(
        "speculative decoding: 'ngram' drafts tokens from the request's own context and the "
        "radix cache and verifies them in one step (lossless); off by default",
        default=None,
        choices=("ngram",),
    )
    speculative_k: int = _opt("most draft tokens verified per request and step", default=8)
    speculative_min_match: int = _opt(
        "shortest n-gram of the context matched to draft from", default=3
    )
    # Several models: the store's, loaded when a request names one (see server/model_pool.py)
    max_loaded_models: int = _opt(
        "most models loaded at once, the default one included (Ollama's per-GPU default; on a "
        "CPU the memory budget is what binds); loading another unloads the least recently "
        "used idle one",
        default=3,
    )
    memory_budget: str | None = _opt(
        "weights + KV of all loaded models, e.g. 12GiB; a model that cannot fit gets a 503 "
        "(default: three quarters of the GPU's memory, or of RAM)",
        default=None,
    )
    keep_alive: str = _opt(
        "unload a model (not the default one) idle this long: seconds or 5m, 1h; -1 = never. "
        "A request's keep_alive (Ollama's, or the same field on OpenAI bodies) sets its own",
        default="5m",
    )
    pin: tuple[str, ...] = _opt(
        "keep this model loaded (repeatable): loaded at start, never unloaded",
        default=(),
        repeatable=True,
    )
    # Server
    host: str = _opt("address to bind", default="127.0.0.1")
    port: int = _opt("port to bind", default=8000)
    api_key: str | None = _opt(
        "require 'Authorization: Bearer KEY' on every route but /health (visible in `ps`: "
        "prefer --api-key-file or $LOCALRADIX_API_KEY)",
        default=None,
    )
    api_key_file: str | None = _opt(
        "read the API keys from this file, one per line: each user's stored responses stay "
        "their own (default: $LOCALRADIX_API_KEY, if set)",
        default=None,
    )
    cors_origins: tuple[str, ...] = _opt(
        "web origins allowed to call the server ('*': any); CORS is off and requests with "
        "another Origin are refused unless given",
        default=(),
    )
    allowed_hosts: tuple[str, ...] = _opt(
        "Host names a loopback server answers to besides localhost and loopback IPs ('*': "
        "any); a guard against DNS rebinding, also enforced on other binds when given",
        default=(),
    )
    no_prompt_previews: bool = _opt(
        "never show prompt text in the stats feed (by default only authenticated or "
        "same-machine clients see it)",
        default=False,
    )
    drain_timeout: float = _opt(
        "on SIGTERM/SIGINT, seconds in-flight requests get to finish before they end with a "
        "503 error (new requests get 503 at once; a second signal ends them now)",
        default=30.0,
    )
    max_body_bytes: int = _opt("largest accepted request body", default=8 * 1024 * 1024)
    engine_restarts: int = _opt(
        "times the engine is restarted after it dies (crash, OOM kill) within 10 minutes; "
        "requests get 503 while it restarts, its cache comes back cold; beyond it (or with 0) "
        "the server exits non-zero",
        default=5,
    )
    http_header_timeout: float = _opt(
        "seconds a connection may take to send a request's headers (from connecting, or from "
        "the previous response); idle and slowloris sockets are closed after it",
        default=30.0,
    )
    http_body_timeout: float = _opt(
        "seconds a request's body may take to arrive after its headers", default=120.0
    )
    max_connections: int | None = _opt(
        "open connections beyond which new ones get a 503 at once (default: the file-"
        "descriptor limit less a reserve for the model, logs and the engine)",
        default=None,
    )
    default_max_tokens: int = _opt(
        "output cap in tokens for chat and completion requests that omit max_tokens (a reply "
        "it cuts ends with finish_reason 'length'); 0 = no cap: run to the context length, "
        "as OpenAI does",
        default=1024,
    )
    grammar_compile_timeout: float = _opt(
        "seconds a structured-output or forced-tool-call grammar may take to compile before "
        "its request gets a 400 (grammars compile beside the engine loop and never delay "
        "other requests)",
        default=10.0,
    )
    tool_call_parser: str = _opt(
        "tool-call dialect for chat requests with tools: auto (detect from the chat template; "
        "generic, tools injected into the prompt, when the template renders no tools), none "
        "(never parse tool calls), hermes, llama3, mistral, mistral-v11, pythonic, "
        "qwen3-coder, glm45, minimax-m2, deepseek-v3.1, deepseek-v3.2, kimi-k2, gemma4, "
        "granite, harmony, generic",
        default="auto",
    )
    keep_billing_header: bool = _opt(
        "keep Claude Code's per-request 'x-anthropic-billing-header: ...; cch=...' line in "
        "/v1/messages system prompts (by default it is dropped before templating: its value "
        "changes every request, so the system prompt and tools after it would never be cached)",
        default=False,
    )
    chat_template: str | None = _opt(
        "a Jinja chat template file that replaces the model's own (e.g. a family's newer "
        "template with tool support); its tool-call and reasoning formats are detected from it",
        default=None,
    )
    reasoning_parser: str | None = _opt(
        "split the model's reasoning into reasoning_content: auto (detect from the chat "
        "template), deepseek-r1, qwen3, magistral, gemma4, harmony (off unless given; "
        "gpt-oss's harmony format is always read)",
        default=None,
    )
    # Replicas behind the smg gateway (localradix.fleet)
    replicas: int = _opt(
        "data-parallel replicas: N > 1 starts N engines, each with its own radix cache (one GPU "
        "each on CUDA, else the CPU cores split between them), and the smg gateway in front on "
        "--host/--port; needs `pip install smg` (the gateway extra)",
        default=1,
        aliases=("--dp",),
    )
    router_policy: str = _opt(
        "how the gateway picks a replica (smg's --policy): cache_aware sends a conversation "
        "back to the replica that holds its prefix",
        default="cache_aware",
        choices=ROUTER_POLICIES,
    )
    log_level: str = _opt(
        "logging level", default="info", choices=("debug", "info", "warning", "error")
    )

    def replace(self, **changes: Any) -> ServerArgs:
        return dataclasses.replace(self, **changes)


def add_server_args(parser: argparse.ArgumentParser, *, skip: tuple[str, ...] = ()) -> None:
    """Add one `--flag` per ServerArgs field (except those in `skip`)."""
    for f in dataclasses.fields(ServerArgs):
        if f.name in skip:
            continue
        flags = ["--" + f.name.replace("_", "-")]
        meta = dict(f.metadata)
        flags += meta.pop("aliases", ())
        kwargs: dict[str, Any] = {"help": meta.pop("help"), "default": f.default}
        annotation = str(f.type)  # a string: this module uses postponed annotations
        if annotation == "bool":
            kwargs["action"] = "store_true"
        elif annotation.startswith("tuple") and meta.get("repeatable"):
            kwargs.update(action="append", default=None)  # --pin A --pin B
        elif annotation.startswith("tuple"):
            kwargs["nargs"] = "*"
        else:
            kwargs["type"] = _parse_type(annotation)
            kwargs.update(meta)
        parser.add_argument(*flags, dest=f.name, **kwargs)


def args_from_namespace(ns: argparse.Namespace) -> ServerArgs:
    names = {f.name for f in dataclasses.fields(ServerArgs)}
    values = {k: v for k, v in vars(ns).items() if k in names}
    for f in dataclasses.fields(ServerArgs):
        if str(f.type).startswith("tuple") and f.name in values:
            values[f.name] = tuple(values[f.name] or ())
    return ServerArgs(**values)


def _parse_type(annotation: str) -> type:
    base = annotation.replace(" | None", "")
    return {"int": int, "float": float, "str": str}[base]
