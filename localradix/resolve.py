"""Every "auto" setting resolved in one place, once, before anything is built.

`platform.choose_backend` picks the backend (`--backend auto` probes the machine); `resolve`
then fixes the rest from that choice: device, dtype, attention kernels, the KV cache's dtype,
overlap scheduling and mixed prefill. What it returns, `Resolved`, is all a runner, the
scheduler and the engine need to know about those settings: `Resolved.args` is `ServerArgs`
with each of them replaced by its value, so nothing downstream ever sees "auto" again.

The parsers' "auto" needs the chat template, which the server reads from the tokenizer:
`tool_parser_for` and `reasoning_parser_for` decide it there. Settings that depend on the
loaded model (context length, the KV pool's size, llama.cpp's idle
cache bound) are defaults derived from the model, not "auto" choices: they are sized where the
model is known (`runner/kv_budget.py`, the runners). No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from localradix.runner.kv_budget import default_kv_dtype

if TYPE_CHECKING:
    from localradix.config import ServerArgs
    from localradix.platform import Choice

AUTO = "auto"
# Device types whose runner works apart from the host, so preparing batch N+1 while batch N
# runs pays; on a CPU the host and the "device" are the same cores.
OVERLAP_DEVICE_TYPES = ("cuda", "npu")


class BackendError(RuntimeError):
    """The requested backend is unknown, unavailable, or cannot run these settings."""


@dataclass(frozen=True)
class Target:
    """Where and how a runner is built: resolved once, before construction."""

    backend: str
    device: str
    dtype: str  # "float32", "bfloat16" or "float16"
    attention_backend: str = "torch_native"  # the spec's attention kernels, by registry name
    kv_dtype: str | None = None  # the KV cache's dtype when it differs from `dtype`

    @property
    def cache_dtype(self) -> str:
        return self.kv_dtype or self.dtype


@dataclass(frozen=True)
class Resolved:
    """The settings with every "auto" decided; `args` carries the same values as flags."""

    args: ServerArgs  # backend, device, dtype, overlap_schedule, mixed_prefill: never "auto"
    target: Target
    overlap: bool  # prepare batch N+1 while the device runs batch N
    mixed_prefill: bool  # decode requests ride along in prefill steps


def resolve(choice: Choice, args: ServerArgs) -> Resolved:
    """Fix every "auto" in `args` for the chosen backend; unsupported settings raise."""
    target = resolve_target(choice, args)
    overlap = overlap_wanted(args.overlap_schedule, target.device)
    mixed = args.mixed_prefill == "on" or (
        args.mixed_prefill == AUTO and choice.spec.mixes_decode_into_prefill
    )
    resolved_args = args.replace(
        backend=target.backend,
        device=target.device,
        dtype=target.dtype,
        overlap_schedule=_on_off(overlap),
        mixed_prefill=_on_off(mixed),
    )
    return Resolved(resolved_args, target, overlap, mixed)


def resolve_target(choice: Choice, args: ServerArgs) -> Target:
    """Device and dtype for this backend, every "auto" resolved; unsupported settings raise."""
    spec, availability = choice.spec, choice.availability
    dtype = args.dtype
    if dtype == AUTO:
        dtype = availability.default_dtype or spec.default_dtype
    if dtype not in spec.dtypes:
        raise BackendError(
            f"backend {spec.name!r} does not support dtype {dtype!r}; "
            f"supported: {', '.join(spec.dtypes)}"
        )
    if not spec.supports_page_size(args.page_size):
        sizes = ", ".join(map(str, spec.page_sizes))
        raise BackendError(
            f"backend {spec.name!r} does not support --page-size {args.page_size}; "
            f"supported: {sizes}"
        )
    if args.quantize not in (AUTO, "off") and not spec.quantizes_at_load:
        raise BackendError(
            f"backend {spec.name!r} cannot honour --quantize {args.quantize}: it keeps the "
            f"weights as loaded; quantizing at load is supported by {_named(choice.quantizing)}"
        )
    _check_tp(spec.name, args.tp)
    attention = _attention(spec.name, spec.attention_backend, args.attention)
    kv_dtype = None
    if attention == "torch_native":  # the one kernel that casts K/V on the way
        kv_dtype = default_kv_dtype(args.dtype, dtype)
    device = args.device or availability.device
    return Target(spec.name, device, dtype, attention, kv_dtype)


# The attention kernels each torch backend can run when asked by name (--attention).
ATTENTION_CHOICES = {
    "cpu": ("torch_native", "triton"),
    "cuda": ("flashinfer", "triton", "torch_native"),
    "rocm": ("flashinfer", "triton", "torch_native"),
}


def _attention(backend: str, default: str, requested: str) -> str:
    if requested == AUTO or requested == default:
        return default
    allowed = ATTENTION_CHOICES.get(backend, ())
    if requested not in allowed:
        can = f"it runs {', '.join(allowed)}" if allowed else "it brings its own kernels"
        raise BackendError(f"backend {backend!r} cannot run --attention {requested}: {can}")
    return requested


# Backends whose runner can split a model over ranks (`localradix.runner.tp`).
TP_BACKENDS = ("cpu", "cuda")


def _check_tp(backend: str, tp: int) -> None:
    if tp < 1:
        raise BackendError(f"--tp {tp}: give 1 or more ranks")
    if tp > 1 and backend not in TP_BACKENDS:
        raise BackendError(
            f"backend {backend!r} cannot honour --tp {tp}: tensor parallelism runs on the torch "
            f"backends ({', '.join('--backend ' + b for b in TP_BACKENDS)}); {backend} runs "
            "the model on one device"
        )


def _named(backends: tuple[str, ...]) -> str:
    """E.g. "--backend mlx": what a refusal suggests instead."""
    return " or ".join(f"--backend {n}" for n in backends) or "no installed backend"


def overlap_wanted(mode: str, device: str) -> bool:
    """`--overlap-schedule`: auto is on for GPUs and NPUs (see OVERLAP_DEVICE_TYPES)."""
    return mode == "on" or (mode == AUTO and device.split(":")[0] in OVERLAP_DEVICE_TYPES)


def tool_parser_for(
    setting: str, chat_template: str | None, renders_tools: bool = True
) -> str | None:
    """`--tool-call-parser`: auto detects the dialect from the chat template (hermes when none
    is seen), or is "generic" when the template does not write the tools it is given
    (`renders_tools`, probed by loader/tool_prompt): the server then writes them itself, in
    the format the generic parser reads. "none" is None; a name must be known (UnknownName
    lists the dialects)."""
    from localradix.parsers.tool_calls import detect_tool_parser, get_tool_parser

    if setting == "none":
        return None
    if setting == AUTO:
        if not renders_tools:  # even where a dialect shows: the model would not see the tools
            return "generic"
        return detect_tool_parser(chat_template) or "hermes"
    get_tool_parser(setting)
    return setting


def reasoning_parser_for(setting: str | None, chat_template: str | None) -> str | None:
    """`--reasoning-parser`: off unless given; auto detects it from the chat template."""
    from localradix.parsers.reasoning import detect_reasoning_parser, get_reasoning_parser

    if setting is None or setting == "none":
        return None
    if setting == AUTO:
        return detect_reasoning_parser(chat_template)
    get_reasoning_parser(setting)  # KeyError naming the known dialects
    return setting


def _on_off(flag: bool) -> str:
    return "on" if flag else "off"
