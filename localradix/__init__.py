"""localradix: a local LLM server with a radix-tree prefix cache.

`from localradix import Engine, SamplingParams` gives the in-process engine; heavy modules load
on first use, so importing the package (and `localradix --help`) stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Engine", "SamplingParams", "ServerArgs", "__version__"]

if TYPE_CHECKING:
    from localradix.config import ServerArgs
    from localradix.engine.engine import Engine
    from localradix.sampling_params import SamplingParams

_LAZY = {
    "Engine": "localradix.engine.engine",
    "SamplingParams": "localradix.sampling_params",
    "ServerArgs": "localradix.config",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'localradix' has no attribute {name!r}")
