"""Arrows only point down: no module of localradix imports one from a layer above its own.

Layers, bottom to top (a module may import its own layer and the ones below):
  0  seam types and plumbing: sampling_params, messages, step, held_text, registry, config,
     limits (request limits and prompt validation), paths (the cache folder), gguf_file (the
     GGUF reader: numpy only)
  1  mem (the radix cache and the KV pool: numpy only), spec (speculative drafts and their
     verification: numpy only, reads the radix cache)
  2  the hardware side and its helpers: store (the model store: the loader resolves store
     names), parsers, constrained, model_api (what model code is written against: attention
     backends, KV layout, TP comm and shards, recurrent state), models, loader, runner, resolve
     (every "auto"), platform (the backend registry: backends import its BackendSpec), backends
  3  sched
  4  engine
  5  the front ends: server, tui, bench, cli, doctor, ps, chat_repl, __main__, and the
     package's __init__
Every import statement counts, including lazy ones inside functions (they run, so they are
dependencies); only `if TYPE_CHECKING:` blocks are skipped (annotations, never executed).

Inside a layer the rooms are ordered too (ORDER): a room imports only those listed before it, so
no package imports one that imports it; and no module imports itself back through others.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "localradix"

# Bottom to top; inside a layer, a room may import only the rooms listed before it.
ORDER: tuple[tuple[str, ...], ...] = (
    (
        "sampling_params",
        "messages",
        "step",
        "held_text",
        "registry",
        "config",
        "limits",
        "paths",
        "gguf_file",
    ),
    ("mem", "spec"),
    (
        "store",
        "parsers",
        "constrained",
        "model_api",
        "models",
        "loader",
        "runner",
        "resolve",
        "platform",
        "backends",
    ),
    ("sched",),
    ("engine",),
    (
        "__init__",
        "child_server",
        "cache_command",
        "server",
        "fleet",
        "tui",
        "bench",
        "cli",
        "serve_command",
        "doctor",
        "ps",
        "chat_repl",
        "__main__",
    ),
)
LAYERS: dict[str, int] = {room: layer for layer, rooms in enumerate(ORDER) for room in rooms}

# Upward imports known while other branches fix them: (importing room, imported room) -> why.
# The lead empties this after merging; an entry that no longer occurs fails the test too.
ALLOWED: dict[tuple[str, str], str] = {}


def room_of(module: str) -> str:
    """The layer key of a dotted module name: "localradix.sched.policy" -> "sched"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def package_of(path: Path) -> str:
    """The package relative imports in `path` start from."""
    name = module_name(path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def imported_modules(source: str, package: str) -> list[tuple[int, str]]:
    """(line, absolute module) of every runtime import of localradix in `source`."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            found.append((node.lineno, base))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return [(line, m) for line, m in found if m == "localradix" or m.startswith("localradix.")]


def upward_imports() -> list[tuple[str, int, str, str]]:
    """(file, line, importer room, imported room) for each import that points up."""
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        me = room_of(module_name(path))
        for line, module in imported_modules(path.read_text(), package_of(path)):
            them = room_of(module)
            if LAYERS[them] > LAYERS[me]:
                bad.append((str(path.relative_to(PACKAGE.parent)), line, me, them))
    return bad


def test_every_room_has_a_layer() -> None:
    rooms = {room_of(module_name(p)) for p in PACKAGE.rglob("*.py")}
    assert rooms <= set(LAYERS), (
        f"give these a layer in tests/test_layers.py: {rooms - set(LAYERS)}"
    )


def test_no_module_imports_a_layer_above_it() -> None:
    bad = upward_imports()
    unexpected = [b for b in bad if (b[2], b[3]) not in ALLOWED]
    assert not unexpected, "upward imports:\n" + "\n".join(
        f"{file}:{line}: {me} (layer {LAYERS[me]}) imports {them} (layer {LAYERS[them]})"
        for file, line, me, them in unexpected
    )
    stale = set(ALLOWED) - {(b[2], b[3]) for b in bad}
    assert not stale, f"no longer occur, remove from ALLOWED: {sorted(stale)}"


def test_the_walker_sees_lazy_and_relative_imports() -> None:
    source = (
        "import numpy\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from localradix.server import app\n"
        "else:\n    from . import policy\n"
        "def f():\n    from ..engine import core\n    import localradix.mem.kv_pool\n"
    )
    modules = [m for _, m in imported_modules(source, "localradix.sched")]
    assert modules == ["localradix.sched", "localradix.engine", "localradix.mem.kv_pool"]
    assert room_of("localradix.sched.policy") == "sched" and room_of("localradix") == "__init__"


def module_graph() -> dict[str, set[str]]:
    """module -> the localradix modules it imports (a `from pkg import sub` names `pkg.sub`)."""
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        targets: set[str] = set()
        tree = ast.parse(path.read_text())
        for node in _runtime_imports(tree):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
                continue
            base = _absolute(node, package_of(path))
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in paths]
            targets.update(subs)
            if len(subs) < len(node.names):
                targets.add(base)
        graph[name] = {t for t in targets if t in paths and t != name}
    return graph


def _runtime_imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, ast.If) and _is_type_checking(node):
        for child in node.orelse:
            yield from _runtime_imports(child)
        return
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    for child in ast.iter_child_nodes(node):
        yield from _runtime_imports(child)


def _absolute(node: ast.ImportFrom, package: str) -> str:
    base = node.module or ""
    if not node.level:
        return base
    up = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join([*up, base] if base else up)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_itself_back() -> None:
    graph = module_graph()
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(
        " <-> ".join(c) + "\n    " + "; ".join(f"{m} -> {sorted(graph[m] & set(c))}" for m in c)
        for c in found
    )


def room_graph() -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {}
    for module, targets in module_graph().items():
        rooms.setdefault(room_of(module), set()).update(room_of(t) for t in targets)
    return rooms


def test_no_package_imports_one_that_imports_it() -> None:
    rooms = room_graph()
    pairs = {
        tuple(sorted((a, b))) for a, ts in rooms.items() for b in ts if a != b and a in rooms[b]
    }
    assert not pairs, f"packages importing each other: {sorted(pairs)}"


def test_rooms_in_a_layer_import_only_those_listed_before_them() -> None:
    """The order inside each layer is the build order: a room stands on the ones before it."""
    position = {room: i for rooms in ORDER for i, room in enumerate(rooms)}
    late = sorted(
        f"{room} imports {other} (listed after it in layer {LAYERS[room]})"
        for room, targets in room_graph().items()
        for other in targets
        if other != room
        and LAYERS.get(other) == LAYERS.get(room)
        and position[other] > position[room]
    )
    assert not late, "\n".join(late)


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(graph) == [["a", "b", "c"]]
