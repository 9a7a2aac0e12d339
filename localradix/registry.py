"""One lazy registry for every pluggable part: name -> "module:attr", imported on first use.

Backends, attention kernels, tool-call dialects and model architectures are each a `Registry`,
so an optional heavy dependency (torch, FlashInfer, MLX) loads only when its entry is chosen,
and an unknown name always fails the same way: `UnknownName`, listing the choices. This module
imports nothing but the standard library (it sits at the bottom of the layers).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class UnknownName(KeyError, ValueError):
    """A name no registry entry has. Both a KeyError and a ValueError, so the callers' existing
    `except KeyError` / `except ValueError` keep working; prints without KeyError's quotes."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def load_object(target: str) -> Any:
    """The object a "package.module:attr.sub" target names (imports the module)."""
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"expected 'module:attr', got {target!r}")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class Registry(Mapping[str, str], Generic[T]):
    """name -> "module:attr" (a read-only mapping of the targets), plus `load(name) -> T`.

    `kind` words the error ("unknown attention backend 'x'; known: ..."); `aliases` map extra
    names to entries (listed as choices too). Loaded objects are cached: one import per entry.
    """

    def __init__(
        self, kind: str, targets: Mapping[str, str], aliases: Mapping[str, str] | None = None
    ) -> None:
        self.kind = kind
        self._targets = dict(targets)
        self.aliases = dict(aliases or {})
        self._loaded: dict[str, T] = {}

    def register(self, name: str, target: str) -> None:
        """Add (or replace) an entry; a plugin's or a backend's own kernels join this way."""
        self._targets[name] = target
        self._loaded.pop(name, None)

    def canonical(self, name: str) -> str:
        """The entry `name` (or its alias) stands for; UnknownName lists the choices."""
        key = self.aliases.get(name, name)
        if key not in self._targets:
            known = ", ".join(sorted([*self._targets, *self.aliases]))
            raise UnknownName(f"unknown {self.kind} {name!r}; known: {known}")
        return key

    def load(self, name: str) -> T:
        """The object registered as `name`, imported on first use."""
        key = self.canonical(name)
        if key not in self._loaded:
            self._loaded[key] = load_object(self._targets[key])
        return self._loaded[key]

    def __getitem__(self, name: str) -> str:
        return self._targets[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._targets)

    def __len__(self) -> int:
        return len(self._targets)
