"""Where localradix keeps what it derives and downloads: `$LOCALRADIX_CACHE_DIR`, else
`$XDG_CACHE_HOME/localradix`, else `~/.cache/localradix`."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    configured = os.environ.get("LOCALRADIX_CACHE_DIR")
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "localradix"
