"""The tool prompt of a model whose chat template has no tools section: the server writes it.

`ToolPrompt.probe` renders a probe conversation with and without a probe tool, whose name is
written nowhere else: a template that writes it renders tools itself and keeps its own format
(`native`). For the others (SmolLM2, Phi-3.5, Gemma 2, ...) `ToolPrompt.messages` does what
llama.cpp's generic chat format did: a tools section (each tool's JSON schema and the reply format
`parsers/generic.py` reads) heads the system message, and the tool history becomes text any
template shows: an assistant's calls as that same JSON reply, tool results as a user turn.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]
# (messages, tools) -> the rendered prompt; raises when the template refuses them
Render = Callable[[list[Message], list[Message] | None], str]

PROBE_NAME = "localradix_probe_tool_5e2b"
PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": PROBE_NAME,
        "description": "Probe 5e2b",
        "parameters": {"type": "object", "properties": {}},
    },
}
PROBE_USER: list[Message] = [{"role": "user", "content": "Hello"}]
# Some templates write tools only beside a system message: probe that too.
PROBE_SYSTEM: list[Message] = [{"role": "system", "content": "Be brief."}, *PROBE_USER]

TOOLS_INTRO = (
    "You can call these tools. Each line is one tool: its name, what it does and the JSON "
    "schema of its arguments."
)
REPLY_FORMAT = (
    "To call tools, reply with only a JSON object of this form, with nothing before or after "
    "it:\n"
    '{"tool_calls": [{"name": "tool_name", "arguments": {"argument_name": "value"}}]}\n'
    "Put one entry in the list for each call. The results come back to you as "
    '{"tool_results": [{"name": "tool_name", "content": "result"}]}.\n'
    "When no tool is needed, reply in plain text."
)


@dataclass(frozen=True)
class ToolPrompt:
    """How tools reach one chat template; the defaults are for a template not known."""

    native: bool = True  # the template writes the tools it is given
    system_role: bool = True  # the template takes a system message

    @classmethod
    def probe(cls, render: Render) -> ToolPrompt:
        """Render the probes once (a few milliseconds); a template refusing every probe keeps
        its own ways."""
        native = any(_writes_probe(render, probe) for probe in (PROBE_USER, PROBE_SYSTEM))
        plain, with_system = _render(render, PROBE_USER), _render(render, PROBE_SYSTEM)
        unknown = plain is None and with_system is None
        return cls(native or unknown, with_system is not None or unknown)

    def messages(self, messages: Sequence[Message], tools: list[Message] | None) -> list[Message]:
        """`messages` for the template, given without tools: the tools section (when `tools`)
        and the tool history written as text."""
        out = history_as_text(messages)
        return self._with_section(out, tool_section(tools)) if tools else out

    def _with_section(self, messages: list[Message], section: str) -> list[Message]:
        """The section heads the first system message (a new one if there is none), or the first
        user message where the template takes no system message. Heading it keeps a prompt's
        prefix the same whatever system text follows (the radix cache)."""
        roles = ("system", "developer") if self.system_role else ("user",)
        at = next((i for i, m in enumerate(messages) if m.get("role") in roles), None)
        if at is None or (self.system_role and at > 0):
            return [{"role": roles[0], "content": section}, *messages]
        text = str(messages[at].get("content") or "")
        content = f"{section}\n\n{text}" if text else section
        return [*messages[:at], {**messages[at], "content": content}, *messages[at + 1 :]]


def involves_tools(messages: Sequence[Message], tools: Sequence[Any] | None) -> bool:
    """Whether a request has tools or tool history: else nothing is written."""
    return bool(tools) or any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


def tool_section(tools: Sequence[Message]) -> str:
    lines = [json.dumps(_tool_line(tool), ensure_ascii=False) for tool in tools]
    return "\n".join([TOOLS_INTRO, *lines, "", REPLY_FORMAT])


def _tool_line(tool: Message) -> Message:
    function = tool.get("function") or {}
    line = {"name": function.get("name")}
    if function.get("description"):
        line["description"] = function["description"]
    line["parameters"] = function.get("parameters") or {"type": "object", "properties": {}}
    return line


# ---- the tool history ------------------------------------------------------------------------


def history_as_text(messages: Sequence[Message]) -> list[Message]:
    """Assistant calls as the JSON reply; each run of tool results as one user turn, joined
    with the user message right after it (templates that want roles to alternate)."""
    names = _call_names(messages)
    out: list[Message] = []
    results: list[Message] = []  # tool results not written yet
    for message in messages:
        role = message.get("role")
        if role == "tool":
            results.append(_result(message, names))
            continue
        text = _results_text(results) if results else None
        results = []
        if text is not None and role == "user":
            user = str(message.get("content") or "")
            out.append({**message, "content": f"{text}\n\n{user}" if user else text})
            continue
        if text is not None:
            out.append({"role": "user", "content": text})
        out.append(_assistant(message) if message.get("tool_calls") else message)
    if results:
        out.append({"role": "user", "content": _results_text(results)})
    return out


def _call_names(messages: Sequence[Message]) -> dict[str, str]:
    """Call id -> function name: a tool result names its call by id only."""
    names = {}
    for message in messages:
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            if call.get("id") and function.get("name"):
                names[call["id"]] = function["name"]
    return names


def _assistant(message: Message) -> Message:
    calls = [_call(call) for call in message["tool_calls"]]
    reply = json.dumps({"tool_calls": calls}, ensure_ascii=False)
    text = str(message.get("content") or "").strip()
    out = {k: v for k, v in message.items() if k != "tool_calls"}
    out["content"] = f"{text}\n\n{reply}" if text else reply
    return out


def _call(call: Message) -> Message:
    function = call.get("function") or {}
    arguments = _json_or_text(function.get("arguments"), {})
    return {"name": function.get("name"), "arguments": arguments}


def _result(message: Message, names: dict[str, str]) -> Message:
    name = message.get("name") or names.get(message.get("tool_call_id") or "")
    content = _json_or_text(message.get("content"), "")
    return {"name": name, "content": content} if name else {"content": content}


def _results_text(results: list[Message]) -> str:
    return json.dumps({"tool_results": results}, ensure_ascii=False)


def _json_or_text(value: Any, empty: Any) -> Any:
    """JSON text as the value it holds (no escaped JSON inside JSON); other text as it is."""
    if not isinstance(value, str):
        return empty if value is None else value
    try:
        return json.loads(value)
    except ValueError:
        return value


def _writes_probe(render: Render, messages: list[Message]) -> bool:
    with_tool = _render(render, messages, [PROBE_TOOL])
    if with_tool is None or PROBE_NAME not in with_tool:
        return False
    without = _render(render, messages)
    return without is None or PROBE_NAME not in without


def _render(
    render: Render, messages: list[Message], tools: list[Message] | None = None
) -> str | None:
    try:
        return render(messages, tools)
    except Exception:  # the template's own refusal: this probe tells nothing
        return None
