"""Hardware detection and the backend registry: which runner serves this machine.

A backend is a `BackendSpec`: what it needs (importable modules), what it supports (dtypes,
attention backend, graph capture, page sizes), a lazy `probe` that says whether this machine can
run it and why, and a lazy `create_runner` that builds its `ModelRunner`. Built-ins are listed in
the lazy registry `BUILTIN_BACKENDS`; plugins register `BackendSpec` objects under the
entry-point group `localradix.backends` (the built-ins are declared there too). A backend whose
dependencies are missing, whose probe fails or whose plugin is broken is skipped with the reason
recorded, never an ImportError at start. Once one is chosen, `resolve.py` decides every "auto"
setting for it, and `build_runner` builds the runner with those values.

Listing backends imports no torch: requirements are checked with `importlib.util.find_spec`,
and only the probes of torch backends import torch, when they run.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from localradix.registry import Registry, load_object
from localradix.resolve import AUTO, BackendError, Resolved, Target, resolve
from localradix.resolve import resolve_target as resolve_target  # re-exported (doctor, tests)

if TYPE_CHECKING:
    from localradix.config import ServerArgs
    from localradix.models.config import ModelConfig
    from localradix.runner.base import ModelRunner
    from localradix.runner.runner_config import RunnerConfig
    from localradix.store.source import ModelSource

logger = logging.getLogger("localradix.platform")

ENTRY_POINT_GROUP = "localradix.backends"

BUILTIN_BACKENDS: Registry[BackendSpec] = Registry(
    "backend",
    {
        "cuda": "localradix.backends.cuda:SPEC",
        "rocm": "localradix.backends.rocm:SPEC",
        "npu": "localradix.backends.npu:SPEC",
        "llamacpp": "localradix.backends.llamacpp:SPEC",
        "mlx": "localradix.backends.mlx:SPEC",
        "cpu": "localradix.backends.cpu:SPEC",
    },
)


@dataclass(frozen=True)
class Availability:
    """A probe's verdict on this machine."""

    ok: bool
    reason: str  # one line: why it is (not) usable
    device: str = ""  # the device string a runner would use by default ("cuda:0", "cpu", "gpu")
    detail: str = ""  # hardware found (name, memory), for `localradix doctor`
    default_dtype: str | None = None  # "auto" on this hardware, when it differs from the spec's


@dataclass(frozen=True)
class BackendSpec:
    """What a backend needs and supports; `probe` and `create_runner` are "module:function".

    probe(explicit: bool) -> Availability. `explicit` is True when the user asked for this
    backend by name (some backends only run on request, e.g. MLX off Apple silicon).
    create_runner(args: RunnerConfig, source: ModelSource, target: Target)
        -> tuple[ModelRunner, ModelConfig]
    """

    name: str
    priority: int  # `--backend auto` picks the available backend with the highest priority
    description: str
    probe_fn: str
    create_runner_fn: str
    requires: tuple[str, ...] = ()  # modules that must be importable (checked without import)
    install_hint: str = ""  # how to get the requirements, e.g. "pip install mlx"
    dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16")
    default_dtype: str = "float32"
    device_types: tuple[str, ...] = ()  # `--device` prefixes that select this backend in auto
    attention_backend: str = "torch_native"
    supports_graphs: bool = False
    page_sizes: tuple[int, ...] = ()  # supported KV page sizes; () = any
    formats: tuple[str, ...] = ("gguf", "hf")  # model formats it loads (`ModelSource.kind`)
    # `--mixed-prefill auto` turns on: a step's cost hardly grows with a few more tokens.
    mixes_decode_into_prefill: bool = False
    # `--quantize` widths are honoured: float weights are quantized at load (MLX).
    quantizes_at_load: bool = False

    def missing_requirements(self) -> list[str]:
        return [m for m in self.requires if not _module_exists(m)]

    def probe(self, explicit: bool = False) -> Availability:
        """Never raises: missing modules and probe errors become a negative Availability."""
        missing = self.missing_requirements()
        if missing:
            hint = f" ({self.install_hint})" if self.install_hint else ""
            return Availability(False, f"{', '.join(missing)} not installed{hint}")
        try:
            return load_object(self.probe_fn)(explicit)
        except Exception as exc:  # a probe must not take the server down
            return Availability(False, f"probe failed: {type(exc).__name__}: {exc}")

    def create_runner(
        self, args: RunnerConfig, source: ModelSource, target: Target
    ) -> tuple[ModelRunner, ModelConfig]:
        return load_object(self.create_runner_fn)(args, source, target)

    def supports_page_size(self, page_size: int) -> bool:
        return not self.page_sizes or page_size in self.page_sizes


@dataclass(frozen=True)
class BackendRecord:
    """One registry entry: a loaded spec, or the error that kept a plugin out."""

    name: str
    origin: str  # "built-in" or "plugin <distribution>"
    spec: BackendSpec | None = None
    error: str | None = None


@dataclass(frozen=True)
class BackendStatus:
    """One line of the detection report."""

    name: str
    available: bool
    reason: str
    priority: int | None = None
    origin: str = "built-in"
    availability: Availability | None = None


@dataclass(frozen=True)
class Choice:
    spec: BackendSpec
    availability: Availability
    report: tuple[BackendStatus, ...] = field(default=())
    # The registered backends that quantize at load (a refusal of --quantize names them).
    quantizing: tuple[str, ...] = ()


@dataclass(frozen=True)
class BuiltRunner:
    """What `EngineCore` needs from the platform: a runner, its model config, where it runs
    and the settings it was built with (`resolved.args`: every "auto" decided)."""

    runner: ModelRunner
    config: ModelConfig
    target: Target
    spec: BackendSpec
    resolved: Resolved


# ---- registry ------------------------------------------------------------------------------


def discover_backends() -> list[BackendRecord]:
    """Built-ins, then entry-point plugins; broken plugins are recorded, not raised."""
    records = [_load_builtin(name) for name in BUILTIN_BACKENDS]
    seen = {r.name for r in records}
    for ep in _entry_points():
        if BUILTIN_BACKENDS.get(ep.name) == ep.value:
            continue  # a built-in's own declaration
        record = _load_plugin(ep)
        if record.name in seen:
            record = BackendRecord(
                record.name, record.origin, None, "name taken by another backend; ignored"
            )
        else:
            seen.add(record.name)
        records.append(record)
    return records


def backend_specs() -> dict[str, BackendSpec]:
    """Every loadable backend by name, highest priority first."""
    specs = [r.spec for r in discover_backends() if r.spec is not None]
    return {s.name: s for s in sorted(specs, key=lambda s: -s.priority)}


def _load_builtin(name: str) -> BackendRecord:
    try:
        return BackendRecord(name, "built-in", _as_spec(BUILTIN_BACKENDS.load(name)))
    except Exception as exc:
        return BackendRecord(name, "built-in", None, f"{type(exc).__name__}: {exc}")


def _load_plugin(ep: Any) -> BackendRecord:
    dist = getattr(getattr(ep, "dist", None), "name", None) or ep.value.partition(":")[0]
    origin = f"plugin {dist}"
    try:
        spec = _as_spec(ep.load())
    except Exception as exc:
        return BackendRecord(ep.name, origin, None, f"{type(exc).__name__}: {exc}")
    return BackendRecord(spec.name, origin, spec)


def _as_spec(obj: Any) -> BackendSpec:
    """An entry point may name a BackendSpec or a zero-argument function returning one."""
    if callable(obj) and not isinstance(obj, BackendSpec):
        obj = obj()
    if not isinstance(obj, BackendSpec):
        raise TypeError(f"expected a BackendSpec, got {type(obj).__name__}")
    return obj


def _entry_points() -> Iterable[Any]:
    from importlib.metadata import entry_points

    try:
        return list(entry_points(group=ENTRY_POINT_GROUP))
    except Exception as exc:  # a corrupt distribution's metadata must not stop detection
        logger.warning("cannot read entry points %r: %s", ENTRY_POINT_GROUP, exc)
        return []


# ---- choosing ------------------------------------------------------------------------------


def choose_backend(
    requested: str = AUTO, device: str | None = None, model_format: str | None = None
) -> Choice:
    """The backend for `--backend requested` (and `--device`), with the detection report.

    auto: every backend is probed and the available one with the highest priority wins (only
    those matching `device`'s type when a device is given, and those that load `model_format`
    when it is given). A name: only that backend is probed (so `--backend mlx` imports no
    torch); an unavailable one raises BackendError.
    """
    records = discover_backends()
    specs = {r.name: r.spec for r in records if r.spec is not None}
    broken = [
        BackendStatus(r.name, False, f"failed to load: {r.error}", None, r.origin)
        for r in records
        if r.spec is None
    ]
    origins = {r.name: r.origin for r in records}
    ordered = sorted(specs.values(), key=lambda s: -s.priority)
    if requested != AUTO:
        return _choose_named(requested, specs, ordered, broken, origins)
    report = [_auto_status(s, device, model_format, origins[s.name]) for s in ordered]
    for spec, status in zip(ordered, report, strict=True):
        if status.available:
            assert status.availability is not None
            return Choice(spec, status.availability, tuple(report + broken), _quantizing(ordered))
    lines = "; ".join(f"{s.name}: {s.reason}" for s in report + broken)
    raise BackendError(f"no backend is available on this machine ({lines})")


def _auto_status(
    spec: BackendSpec, device: str | None, model_format: str | None, origin: str
) -> BackendStatus:
    if not _matches_device(spec, device):
        reason = f"--device {device} selects another backend"
        return BackendStatus(spec.name, False, reason, spec.priority, origin)
    if model_format is not None and model_format not in spec.formats:
        reason = f"cannot load {model_format} models (loads {', '.join(spec.formats)})"
        return BackendStatus(spec.name, False, reason, spec.priority, origin)
    return _status(spec, spec.probe(explicit=False), origin)


def _choose_named(
    requested: str,
    specs: dict[str, BackendSpec],
    ordered: list[BackendSpec],
    broken: list[BackendStatus],
    origins: dict[str, str],
) -> Choice:
    failed = {b.name: b for b in broken}
    if requested in failed:
        raise BackendError(f"backend {requested!r} {failed[requested].reason}")
    if requested not in specs:
        known = ", ".join([AUTO, *(s.name for s in ordered)])
        raise BackendError(f"unknown backend {requested!r}; choose one of: {known}")
    spec = specs[requested]
    availability = spec.probe(explicit=True)
    report = [
        _status(spec, availability, origins[spec.name])
        if s is spec
        else BackendStatus(
            s.name, False, f"not probed (--backend {requested})", s.priority, origins[s.name]
        )
        for s in ordered
    ]
    if not availability.ok:
        raise BackendError(f"backend {requested!r} is not available: {availability.reason}")
    return Choice(spec, availability, tuple(report + broken), _quantizing(ordered))


def _quantizing(specs: list[BackendSpec]) -> tuple[str, ...]:
    return tuple(s.name for s in specs if s.quantizes_at_load)


def detect_all() -> list[BackendStatus]:
    """Probe every backend as auto-detection would (for `localradix doctor`)."""
    records = discover_backends()
    statuses = [
        _status(r.spec, r.spec.probe(explicit=False), r.origin)
        if r.spec is not None
        else BackendStatus(r.name, False, f"failed to load: {r.error}", None, r.origin)
        for r in records
    ]
    return sorted(statuses, key=lambda s: -(s.priority if s.priority is not None else -1))


def _status(spec: BackendSpec, availability: Availability, origin: str) -> BackendStatus:
    return BackendStatus(
        spec.name, availability.ok, availability.reason, spec.priority, origin, availability
    )


def _matches_device(spec: BackendSpec, device: str | None) -> bool:
    if not device:
        return True
    return device.split(":")[0] in spec.device_types


# ---- building ----------------------------------------------------------------


def build_runner(args: ServerArgs, source: ModelSource) -> BuiltRunner:
    """Choose the backend for `args`, resolve every "auto" (`resolve.py`), load the model and
    build the runner with the resolved settings."""
    choice = choose_backend(args.backend, args.device, source.kind)
    resolved = resolve(choice, args)
    target = resolved.target
    logger.info(
        "Backend %s (%s), device %s, dtype %s",
        target.backend,
        choice.availability.reason,
        target.device,
        target.dtype,
    )
    from localradix.runner.runner_config import RunnerConfig  # (no torch: a dataclass)

    settings = RunnerConfig.from_args(resolved.args)  # what the runner reads, taken once
    runner, config = choice.spec.create_runner(settings, source, target)
    cap = runner.max_running_requests  # a runner holding fewer request rows lowers the limit
    if cap is not None and cap < resolved.args.max_running_requests:
        args = resolved.args.replace(max_running_requests=cap)
        resolved = dataclasses.replace(resolved, args=args)
    return BuiltRunner(runner, config, target, choice.spec, resolved)


# ---- helpers -------------------------------------------------------------------------------


def _module_exists(name: str) -> bool:
    """Whether `name` is importable, without importing it (its parents may be imported)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
