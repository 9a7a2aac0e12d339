"""Tool-call parsers: the registry of dialects and the choice of one from a chat template.

Each dialect is a `ToolCallStreamParser` subclass (see `tool_stream`): construct one per
response for streaming (`feed` / `finish`), or call its classmethod `parse(text)` for a whole
output. The registry imports a dialect's module only when it is asked for.
"""

from __future__ import annotations

from localradix.parsers.events import (
    ContentDelta,
    ParsedToolCalls,
    StreamEvent,
    ToolCall,
    ToolCallDelta,
    new_call_id,
)
from localradix.parsers.tool_stream import ToolCallStreamParser
from localradix.registry import Registry

__all__ = [
    "TOOL_PARSERS",
    "ContentDelta",
    "ParsedToolCalls",
    "StreamEvent",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallStreamParser",
    "detect_tool_parser",
    "get_tool_parser",
    "new_call_id",
]

# name -> "module:Class"; "mistral-v11" differs from "mistral" only in the wire format its
# constraint (tool_constraint) forces: its parser reads both layouts.
TOOL_PARSERS: Registry[type[ToolCallStreamParser]] = Registry(
    "tool-call parser",
    {
        "hermes": "localradix.parsers.hermes:HermesToolParser",
        "llama3": "localradix.parsers.llama3:Llama3JsonToolParser",
        "mistral": "localradix.parsers.mistral:MistralToolParser",
        "mistral-v11": "localradix.parsers.mistral:MistralToolParser",
        "pythonic": "localradix.parsers.pythonic:PythonicToolParser",
    },
    aliases={"qwen": "hermes", "qwen2.5": "hermes", "qwen3": "hermes", "llama": "llama3"},
)


def get_tool_parser(name: str) -> type[ToolCallStreamParser]:
    """The parser class of dialect `name` (or an alias); UnknownName (a KeyError) names the
    known ones."""
    return TOOL_PARSERS.load(name)


def detect_tool_parser(chat_template: str | None) -> str | None:
    """Guess the dialect from the markers a chat template writes (None: no tool support seen).

    In order: `[TOOL_CALLS]` -> mistral ("mistral-v11" when the template also writes `[ARGS]`);
    Qwen3-Coder's XML calls (`<function=` with `<parameter=`) -> None (not supported);
    `<tool_call>` -> hermes; `<|python_start|>` or a pythonic instruction
    (`[func_name1(`) -> pythonic; `<|python_tag|>` or an `ipython` role header -> llama3.
    """
    if not chat_template:
        return None
    text = chat_template
    if "[TOOL_CALLS]" in text:
        return "mistral-v11" if "[ARGS]" in text else "mistral"
    if "<function=" in text and "<parameter=" in text:
        return None
    if "<tool_call>" in text:
        return "hermes"
    if "<|python_start|>" in text or "[func_name1(" in text:
        return "pythonic"
    if "<|python_tag|>" in text or "ipython<|end_header_id|>" in text:
        return "llama3"
    return None
