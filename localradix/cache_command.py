"""`localradix cache`: what the prefix cache's disk tier holds, and `cache clear` to empty it.

The disk tier keeps KV across restarts in a folder of the user's (by default
~/.cache/localradix/kv, up to 16 GiB), per model fingerprint. Nothing else shows where that
space went, which model it is for or how stale it is, so this lists it (a row per model: name,
backend, dtype, files, size, last used) and deletes it (all of it, or one model's). Clearing
loses nothing but speed: a server that needs a prefix again prefills it. The folder and budget
come from the same flags, environment and defaults as `serve`'s (`tier_settings`), so both
name the same folder. Light at import time: localradix.mem (numpy) loads only when the command
runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localradix.mem.disk_tier import StoredModel
    from localradix.mem.tier_settings import DiskTierSettings

# tier_settings' DIR_ENV, named here too: importing localradix.mem loads numpy, which `--help`
# should not wait for.
DIR_ENV = "LOCALRADIX_KV_DISK_CACHE"
HOW_TO_TURN_ON = (
    f"`localradix serve --kv-disk-cache DIR` (or ${DIR_ENV}=DIR) keeps cached prefixes across "
    "restarts"
)

HEADER = ("NAME", "BACKEND", "DTYPE", "FILES", "SIZE", "LAST USED", "FINGERPRINT")


def add_cache_parser(subparsers: Any) -> None:
    where = _folder_options()
    p = subparsers.add_parser(
        "cache",
        parents=[where],
        help="show or clear the prefix cache's disk tier (KV kept across restarts)",
        description="List what the prefix cache's disk tier holds, per model "
        "(`localradix cache ls`, the default), or delete it (`localradix cache clear [MODEL]`).",
    )
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                   help="print one JSON object instead")  # fmt: skip
    actions = p.add_subparsers(dest="cache_action", metavar="ACTION")
    ls = actions.add_parser("ls", parents=[where], help="what is stored, per model (default)")
    ls.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                    help="print one JSON object instead")  # fmt: skip
    clear = actions.add_parser(
        "clear",
        parents=[where],
        help="delete the stored KV (every model's, or MODEL's)",
        description="Delete every stored chunk, or only those of the models whose name or "
        "fingerprint starts with MODEL. A server that needs a prefix again prefills it.",
    )
    clear.add_argument("model", metavar="MODEL", nargs="?", help="a model name or fingerprint")


def _folder_options() -> argparse.ArgumentParser:
    """`serve`'s disk-tier flags, on `cache` and on each action (SUPPRESS: an action's parser
    leaves a value given before the action alone)."""
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--kv-disk-cache", metavar="DIR", default=argparse.SUPPRESS,
                       help=f"the disk tier's folder, as serve's flag (default: ${DIR_ENV}, "
                       "else ~/.cache/localradix/kv)")  # fmt: skip
    where.add_argument("--kv-disk-gib", metavar="GIB", type=float, default=argparse.SUPPRESS,
                       help="its budget, as serve's flag (shown only)")  # fmt: skip
    return where


def run_cache(ns: argparse.Namespace) -> int:
    try:
        settings = tier_settings(
            getattr(ns, "kv_disk_cache", None), getattr(ns, "kv_disk_gib", None)
        )
    except ValueError as exc:  # a $LOCALRADIX_KV_DISK_GIB that is not a number
        print(f"localradix: error: {exc}", file=sys.stderr)
        return 2
    if getattr(ns, "cache_action", None) == "clear":
        return clear(settings, ns.model)
    return show(settings, as_json=getattr(ns, "json", False))


# ---- ls ----------------------------------------------------------------------------------------


def show(settings: DiskTierSettings, as_json: bool = False) -> int:
    models = _stored(settings)
    if as_json:
        print(json.dumps(report(settings, models), indent=2))
        return 0
    if not settings.on:
        print(f"KV disk cache: off ({off_reason(settings.why)}): {HOW_TO_TURN_ON}")
        return 0
    if not models:
        print(
            f"KV disk cache: nothing stored in {settings.folder} yet (budget "
            f"{human_bytes(settings.budget_bytes)}): `localradix serve` fills it with the KV "
            "its pool evicts and, at a graceful stop, all it has cached (torch, MLX and llama.cpp backends)"
        )
        return 0
    used = sum(m.bytes for m in models)
    print(
        f"KV disk cache: {settings.folder}, {human_bytes(used)} used of "
        f"{human_bytes(settings.budget_bytes)} ({settings.why})\n"
    )
    print(_table(models))
    print("\n`localradix cache clear [MODEL]` deletes them (all, or one model's)")
    return 0


def off_reason(why: str) -> str:
    """Why the tier is off (`DiskTierSettings.why`), naming the flag or variable that said so."""
    return f"--kv-disk-cache or ${DIR_ENV} says off" if why == "turned off" else why


def report(settings: DiskTierSettings, models: list[StoredModel]) -> dict[str, Any]:
    """What `cache --json` prints: the folder, its budget and why, and each stored model."""
    return {
        "on": settings.on,
        "folder": str(settings.folder) if settings.folder else None,
        "budget_bytes": settings.budget_bytes,
        "why": settings.why,
        "used_bytes": sum(m.bytes for m in models),
        "files": sum(m.files for m in models),
        "models": [_model_dict(m) for m in models],
    }


def _model_dict(m: StoredModel) -> dict[str, Any]:
    info = m.model
    return {
        "name": model_name(m),
        "path": info.get("path"),
        "backend": info.get("backend"),
        "dtype": info.get("dtype"),
        "kv_dtype": info.get("kv_dtype"),
        "files": m.files,
        "bytes": m.bytes,
        "last_used": m.newest or None,
        "fingerprint": m.fingerprint,
    }


def _table(models: list[StoredModel]) -> str:
    now = time.time()
    rows = [HEADER]
    for m in models:
        rows.append((
            model_name(m), str(m.model.get("backend") or "-"), str(m.model.get("dtype") or "-"),
            str(m.files), human_bytes(m.bytes), age(m.newest, now), m.fingerprint,
        ))  # fmt: skip
    files, size = sum(m.files for m in models), sum(m.bytes for m in models)
    rows.append(("total", "", "", str(files), human_bytes(size), "", ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


# ---- clear -------------------------------------------------------------------------------------


def clear(settings: DiskTierSettings, model: str | None) -> int:
    """Delete every chunk, or MODEL's; exit status 2 when MODEL names nothing stored."""
    from localradix.mem.disk_tier import clear_stored

    models = _stored(settings)
    if model is not None:
        models = [m for m in models if matches(m, model)]
        if not models:
            where = settings.folder if settings.on else "it is off"
            print(
                f"localradix: error: no model matching {model!r} in the KV disk cache ({where}): "
                "`localradix cache` lists them",
                file=sys.stderr,
            )
            return 2
    if not settings.on or settings.folder is None:
        print(f"KV disk cache: off ({off_reason(settings.why)}): nothing to clear")
        return 0
    freed: dict[str, int] = {}
    for m in models:
        name = model_name(m)
        freed[name] = freed.get(name, 0) + clear_stored(settings.folder, m.fingerprint)
    total = sum(freed.values())
    if model is None:  # and what no listed model holds (a dead writer's temporary files)
        total += clear_stored(settings.folder)
    what = ", ".join(f"{name} {human_bytes(n)}" for name, n in freed.items())
    print(f"freed {human_bytes(total)} in {settings.folder}" + (f" ({what})" if what else ""))
    return 0


def matches(m: StoredModel, model: str) -> bool:
    """MODEL names `m`: a prefix of its name (any case) or of its fingerprint."""
    wanted = model.lower()
    return model_name(m).lower().startswith(wanted) or m.fingerprint.startswith(wanted)


# ---- shared ------------------------------------------------------------------------------------


def tier_settings(folder: str | None, gib: float | None) -> DiskTierSettings:
    """The folder and budget `serve` with these flags would use."""
    from localradix.mem.tier_settings import disk_tier_settings

    return disk_tier_settings(folder, gib)


def stored_report(folder: str | None, gib: float | None) -> dict[str, Any]:
    """`cache --json`'s object for these flags (doctor's KV disk cache section)."""
    settings = tier_settings(folder, gib)
    return report(settings, _stored(settings))


def _stored(settings: DiskTierSettings) -> list[StoredModel]:
    """The stored models with at least one chunk (a cleared model's folder keeps its
    model.json for the server that may still be writing there)."""
    if settings.folder is None:
        return []
    from localradix.mem.disk_tier import stored_models

    return [m for m in stored_models(Path(settings.folder)) if m.files]


def model_name(m: StoredModel) -> str:
    return str(m.model.get("name") or m.fingerprint)


def human_bytes(n: float) -> str:
    """1,536 -> "1.5 KiB": binary units, as the budget's GiB are."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def age(when: float, now: float | None = None) -> str:
    """How long ago `when` (a Unix time) was: "just now", "3 min ago", "5 h ago", "2 days ago"."""
    if not when:
        return "-"
    seconds = max(0.0, (time.time() if now is None else now) - when)
    if seconds < 60:
        return "just now"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min ago"
    if seconds < 86400:
        return f"{seconds // 3600:.0f} h ago"
    days = seconds // 86400
    return f"{days:.0f} day{'s' if days != 1 else ''} ago"
