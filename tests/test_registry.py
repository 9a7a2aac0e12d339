"""The lazy registry every pluggable part uses: imports on first use, one error wording."""

from __future__ import annotations

import sys

import pytest

from localradix.registry import Registry, UnknownName, load_object


def test_load_object_walks_attributes() -> None:
    assert load_object("os.path:join") is __import__("os").path.join
    assert load_object("os:path.join") is __import__("os").path.join
    with pytest.raises(ValueError, match="module:attr"):
        load_object("os.path")


def test_entries_import_only_when_loaded() -> None:
    module = "localradix.parsers.pythonic"
    sys.modules.pop(module, None)
    reg: Registry[type] = Registry("thing", {"py": f"{module}:PythonicToolParser"})
    assert module not in sys.modules  # listing and lookup of targets import nothing
    assert "py" in reg and list(reg) == ["py"] and len(reg) == 1
    cls = reg.load("py")
    assert module in sys.modules and cls.__name__ == "PythonicToolParser"
    assert reg.load("py") is cls


def test_unknown_names_list_the_choices_and_aliases_resolve() -> None:
    reg: Registry[object] = Registry("widget", {"a": "os:sep"}, aliases={"alpha": "a"})
    assert reg.load("alpha") is reg.load("a")
    with pytest.raises(UnknownName) as info:
        reg.load("zeta")
    assert str(info.value) == "unknown widget 'zeta'; known: a, alpha"
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)


def test_register_replaces_and_forgets_the_loaded_object() -> None:
    reg: Registry[object] = Registry("widget", {"a": "os:sep"})
    assert reg.load("a") == __import__("os").sep
    reg.register("a", "os:curdir")
    assert reg.load("a") == __import__("os").curdir
