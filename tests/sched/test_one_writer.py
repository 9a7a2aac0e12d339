"""One writer per part of a request (`localradix/sched/request.py`): every assignment to a
part's field anywhere in `localradix/` happens in the module the part declares in `WRITERS`
(or in the part's own methods), and no part names more than one writer.

Found statically: `x.<part>.<field> = ...` (also augmented, unpacked, subscripted or `del`),
mutating calls (`x.<part>.<field>.append(...)`), `setattr(x.<part>, ...)`, and the same through
a local alias (`hold = req.hold; hold.kv_len = ...`).
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from localradix.sched import request
from localradix.sched.request import Req

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "localradix"
MUTATORS = frozenset(
    "append extend insert pop remove clear sort reverse update setdefault add discard".split()
)
# Req's attribute -> the part class it holds.
PARTS: dict[str, type] = {f.name: getattr(request, str(f.type)) for f in dataclasses.fields(Req)}


@dataclasses.dataclass(frozen=True)
class Write:
    module: str
    line: int
    part: str  # Req's attribute holding the part
    field: str  # "" for a write that replaces the part itself

    def __str__(self) -> str:
        return f"{self.module}:{self.line} writes {self.part}.{self.field or '<the part>'}"


def part_fields(part: type) -> set[str]:
    return {f.name for f in dataclasses.fields(part)}


def _targets(node: ast.AST) -> Iterator[ast.AST]:
    """The expressions an assignment statement stores into (tuples unpacked)."""
    if isinstance(node, (ast.Tuple, ast.List)):
        for elt in node.elts:
            yield from _targets(elt)
    elif isinstance(node, ast.Starred):
        yield from _targets(node.value)
    else:
        yield node


def _part_of(expr: ast.AST, aliases: dict[str, str]) -> str | None:
    """The part `expr` denotes: `<anything>.<part>`, or a local alias of one."""
    if isinstance(expr, ast.Attribute) and expr.attr in PARTS:
        return expr.attr
    if isinstance(expr, ast.Name):
        return aliases.get(expr.id)
    return None


def _aliases(scope: ast.AST) -> dict[str, str]:
    """Local names bound to a part in `scope` (`hold = req.hold`, `a, h = x, req.hold`)."""
    found: dict[str, str] = {}
    for node in ast.walk(scope):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            pairs = [(target, node.value)]
            if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                pairs = list(zip(target.elts, node.value.elts))
            for name, value in pairs:
                part = _part_of(value, {})
                if isinstance(name, ast.Name) and part is not None:
                    found[name.id] = part
    return found


def _stored(node: ast.AST) -> list[ast.AST]:
    """What `node` writes into, if it is a write."""
    if isinstance(node, ast.Assign):
        return [t for target in node.targets for t in _targets(target)]
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return list(_targets(node.target))
    if isinstance(node, ast.Delete):
        return [t for target in node.targets for t in _targets(target)]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr in MUTATORS:
            return [node.func.value]
    return []


def writes_in(source: str, module: str) -> list[Write]:
    """Every write to a part's field (or a part) in `source`."""
    tree = ast.parse(source)
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    aliases: dict[int, dict[str, str]] = {}
    for scope in [tree, *scopes]:  # inner scopes last: a node takes its innermost's aliases
        bound = _aliases(scope)
        aliases.update((id(n), bound) for n in ast.walk(scope))
    found = []
    for node in ast.walk(tree):
        local = aliases.get(id(node), {})
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
            part = _part_of(node.args[0], local)
            if node.func.id in ("setattr", "delattr") and part is not None:
                name = node.args[1].value if isinstance(node.args[1], ast.Constant) else "?"
                found.append(Write(module, node.lineno, part, str(name)))
        for target in _stored(node):
            while isinstance(target, ast.Subscript):  # x.part.field[i] = ... writes the field
                target = target.value
            if not isinstance(target, ast.Attribute):
                continue
            part = _part_of(target.value, local)
            if part is not None and target.attr in part_fields(PARTS[part]):
                found.append(Write(module, node.lineno, part, target.attr))
            elif target.attr in PARTS and not _is_self(target.value):
                found.append(Write(module, node.lineno, target.attr, ""))
    return sorted(set(found), key=lambda w: (w.line, w.part, w.field))


def _is_self(expr: ast.AST) -> bool:
    return isinstance(expr, ast.Name) and expr.id == "self"


def all_writes() -> list[Write]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found += writes_in(path.read_text(), module)
    return found


def foreign(writes: list[Write]) -> list[Write]:
    return [w for w in writes if not w.field or w.module not in PARTS[w.part].WRITERS]


def test_req_is_made_of_parts_each_with_at_most_one_writer() -> None:
    assert len(PARTS) == len(dataclasses.fields(Req))
    for name, part in PARTS.items():
        assert dataclasses.is_dataclass(part), name
        assert len(part.WRITERS) <= 1, f"{part.__name__} has writers {part.WRITERS}"
        untyped = [f.name for f in dataclasses.fields(part) if str(f.type) in ("Any", "object")]
        assert not untyped, f"{part.__name__}: fields typed Any: {untyped}"


def test_every_field_write_is_in_its_parts_writer() -> None:
    bad = foreign(all_writes())
    assert not bad, "writes outside the part's WRITERS:\n" + "\n".join(map(str, bad))


def test_every_declared_writer_writes_its_part() -> None:
    writers = {(w.module, w.part) for w in all_writes()}
    for name, part in PARTS.items():
        for module in part.WRITERS:
            assert (module, name) in writers, f"{module} is declared but never writes {name}"


@pytest.mark.parametrize(
    "line",
    [
        "req.hold.kv_len = 3",
        "req.hold.kv_len += 1",
        "a, req.hold.row = 1, None",
        "req.progress.output_ids.append(4)",
        "req.progress.output_ids[0] = 4",
        "hold = req.hold\n    hold.kv_len = 3",
        "setattr(req.hold, 'kv_len', 3)",
        "req.hold = None",
    ],
)
def test_a_planted_foreign_write_is_found(line: str) -> None:
    source = f"def f(req):\n    {line}\n"
    writes = writes_in(source, "localradix.sched.decode")
    assert writes and foreign(writes) == writes, writes


def test_reads_and_the_owners_writes_are_not_flagged() -> None:
    source = (
        "def f(req, self):\n"
        "    n = req.hold.kv_len + len(req.progress.output_ids)\n"
        "    self.kv_len = n\n"
        "    spec = req.drafts.spec\n"
        "    spec.masks = None\n"
    )
    assert writes_in(source, "localradix.sched.decode") == []
    owner = writes_in("def f(req):\n    req.hold.kv_len = 1\n", "localradix.sched.slot_handoff")
    assert owner and foreign(owner) == []
