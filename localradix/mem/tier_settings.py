"""Where the disk tier lives and how much it may keep: flags, then environment, then defaults.

Shared by the engine (which opens the tier), `localradix cache` and `doctor` (which show it),
so all three name the same folder and budget.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DIR_ENV = "LOCALRADIX_KV_DISK_CACHE"
GIB_ENV = "LOCALRADIX_KV_DISK_GIB"
OFF = ("off", "none", "0", "false")
FREE_SHARE = 0.1  # of the disk's free space, by default...
MAX_DEFAULT_GIB = 16.0  # ...at most this much
GIB = 2**30


@dataclass(frozen=True)
class DiskTierSettings:
    folder: Path | None  # None: the disk tier is off
    budget_bytes: int
    why: str  # where the folder and budget came from, for the log and doctor

    @property
    def on(self) -> bool:
        return self.folder is not None and self.budget_bytes > 0


def default_folder(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "localradix" / "kv"


def disk_tier_settings(
    folder: str | None, gib: float | None, environ: Mapping[str, str] | None = None
) -> DiskTierSettings:
    """The disk tier `--kv-disk-cache` / `--kv-disk-gib` (or their environment variables, or
    the defaults) ask for."""
    env = os.environ if environ is None else environ
    spec = folder if folder is not None else env.get(DIR_ENV)
    if spec is not None and spec.strip().lower() in OFF:
        return DiskTierSettings(None, 0, "turned off")
    path = Path(spec).expanduser() if spec else default_folder(env)
    if gib is None and env.get(GIB_ENV):
        gib = float(env[GIB_ENV])
    if gib is not None:
        return DiskTierSettings(path if gib > 0 else None, int(gib * GIB), f"{gib:g} GiB asked for")
    free = _free_bytes(path)
    budget = int(min(FREE_SHARE * free, MAX_DEFAULT_GIB * GIB))
    why = f"a tenth of the {free / GIB:.0f} GiB free, at most {MAX_DEFAULT_GIB:g} GiB"
    return DiskTierSettings(path if budget > 0 else None, budget, why)


def _free_bytes(path: Path) -> int:
    """Free space on the disk that holds (or will hold) `path`."""
    for parent in (path, *path.parents):
        if parent.exists():
            return shutil.disk_usage(parent).free
    return 0
