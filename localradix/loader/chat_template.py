"""Chat templates rendered the way transformers renders them.

A sandbox (trim_blocks, lstrip_blocks, loopcontrols), transformers' helpers
(`raise_exception`, a `tojson` that keeps non-ASCII and takes indent/separators/sort_keys,
`strftime_now`) and a `{% generation %}` block that just renders its body. Templates come from
model repos and are untrusted code, hence the sandbox. Unlike transformers' immutable one, it
lets a template grow its own lists and dicts (Kimi K2's `.append(...)`, as llama.cpp's engine
allows): it renders deep copies of the request's messages and tools, so nothing a template
changes reaches the server. `tojson` also takes what `map` and `select` return (generators in
Jinja, lists in llama.cpp's engine: DeepSeek-R1's template pipes one into it).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import SandboxedEnvironment


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: transformers tracks assistant spans; we render."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_render")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x,
        ensure_ascii=ensure_ascii,
        indent=indent,
        separators=separators,
        sort_keys=sort_keys,
        default=_as_json,
    )


def _as_json(value: Any) -> Any:
    """What json cannot encode itself: a filter's generator becomes its list."""
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes, Mapping)):
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def compile_chat_template(source: str) -> jinja2.Template:
    env = SandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def render_chat_template(source: str, **context: Any) -> str:
    """Render `source` with `messages`, `tools`, `add_generation_prompt`, special tokens, ...
    (copies of them: a template may change what it is given)."""
    return compile_chat_template(source).render(**copy.deepcopy(context))


def select_template(
    chat_template: str | list[dict[str, str]] | None, name: str | None = None
) -> str | None:
    """tokenizer_config's `chat_template` may be a string or a list of {name, template}."""
    if chat_template is None or isinstance(chat_template, str):
        return chat_template
    named = {t["name"]: t["template"] for t in chat_template}
    if name is not None:
        return named.get(name)
    return named.get("default") or next(iter(named.values()), None)
