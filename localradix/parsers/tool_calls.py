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
        "qwen3-coder": "localradix.parsers.qwen3_coder:Qwen3CoderToolParser",
        "glm45": "localradix.parsers.glm:Glm45ToolParser",
        "minimax-m2": "localradix.parsers.minimax:MiniMaxM2ToolParser",
        "deepseek-v3.1": "localradix.parsers.deepseek:DeepSeekV31ToolParser",
        "deepseek-v3.2": "localradix.parsers.deepseek:DeepSeekV32ToolParser",
        "kimi-k2": "localradix.parsers.kimi:KimiK2ToolParser",
        "gemma4": "localradix.parsers.gemma4:Gemma4ToolParser",
        "granite": "localradix.parsers.granite:GraniteToolParser",
        "harmony": "localradix.parsers.harmony:HarmonyToolParser",
        "generic": "localradix.parsers.generic:GenericToolParser",
    },
    aliases={
        "qwen": "hermes",
        "qwen2.5": "hermes",
        "qwen3": "hermes",
        "llama": "llama3",
        "qwen3.5": "qwen3-coder",
        "qwen3.6": "qwen3-coder",
        "nemotron": "qwen3-coder",
        "glm4.5": "glm45",
        "glm4.6": "glm45",
        "glm4.7": "glm45",
        "minimax": "minimax-m2",
        "deepseek": "deepseek-v3.1",
        "kimi": "kimi-k2",
        "gpt-oss": "harmony",
        "granite4": "hermes",
    },
)


def get_tool_parser(name: str) -> type[ToolCallStreamParser]:
    """The parser class of dialect `name` (or an alias); UnknownName (a KeyError) names the
    known ones."""
    return TOOL_PARSERS.load(name)


# (dialect, markers its chat template writes), most specific first.
_SIGNATURES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("harmony", ("<|channel|>", "<|message|>")),
    ("gemma4", ("<|tool_call>", "call:")),
    ("deepseek-v3.2", ("DSML", "invoke")),
    ("deepseek-v3.1", ("<｜tool▁calls▁begin｜>",)),
    ("kimi-k2", ("<|tool_calls_section_begin|>",)),
    ("minimax-m2", ("<minimax:tool_call>", "<invoke name=")),
    ("glm45", ("<arg_key>", "<arg_value>")),
    ("qwen3-coder", ("<function=", "<parameter=")),
    ("granite", ("<|tool_call|>",)),
)


def detect_tool_parser(chat_template: str | None) -> str | None:
    """Guess the dialect from the markers a chat template writes (None: no tool support seen).

    The markers are checked most specific first: a template's own call syntax (harmony's
    `<|channel|>` messages, Gemma 4's `<|tool_call>`, DeepSeek's and Kimi's call tokens, MiniMax's
    `<minimax:tool_call>`, GLM's `<arg_key>`, Qwen3-Coder's `<function=` + `<parameter=`,
    Granite 3's `<|tool_call|>`) before the generic `<tool_call>` of hermes; then
    `[TOOL_CALLS]` -> mistral ("mistral-v11" when the template also writes `[ARGS]`);
    `<|python_start|>` or a pythonic instruction (`[func_name1(`) -> pythonic; `<|python_tag|>`
    or an `ipython` role header -> llama3.
    """
    if not chat_template:
        return None
    text = chat_template
    for dialect, needles in _SIGNATURES:
        if all(needle in text for needle in needles):
            return dialect
    if "[TOOL_CALLS]" in text:
        return "mistral-v11" if "[ARGS]" in text else "mistral"
    if "<tool_call>" in text:
        return "hermes"
    if "<|python_start|>" in text or "[func_name1(" in text:
        return "pythonic"
    if "<|python_tag|>" in text or "ipython<|end_header_id|>" in text:
        return "llama3"
    return None
