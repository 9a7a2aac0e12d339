"""gpt-oss's harmony format: reasoning, tool calls and the answer are messages on channels.

The prompt ends with `<|start|>assistant`; the output is one or more messages

    HEADER<|message|>TEXT<|end|>   then   <|start|>assistant HEADER<|message|>TEXT ...

where HEADER is `<|channel|>CHANNEL`, with an optional recipient ` to=functions.NAME` before
or after the channel and an optional content type (` json`, ` <|constrain|>json`) after it:

- `analysis` -> reasoning (`delta.reasoning_content`);
- a message to `functions.NAME`, on any channel -> a call of NAME, its TEXT the JSON arguments;
- `final`, and `commentary` without a recipient (a preamble the user sees) -> content.

`<|call|>` and `<|return|>` are stop tokens, so the end of output is how the last message
normally ends (a call is complete when its JSON is); they, `<|end|>`, and a `<|start|>` or
`<|channel|>` where `<|end|>` was left out all end a message. Output that opens with no header
is content. Messages of one kind are joined by a blank line.

Streaming sends reasoning and content as they arrive, holding back only what may still be a
marker; a call is sent whole, in one delta, once its message ends and its arguments parse as a
JSON object. A call that does not (cut off by max_tokens, broken) is dropped with
`complete_calls` (what the server uses), else shown as content. A call whose name is not
allowed (no tools: `tool_names == ()`; or a name not in them) is shown as content as written,
header and all: never lost. The output depends only on the concatenated input, not on how it is
split: `parse_harmony` runs the same machine over the whole text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from typing import Any

from localradix.held_text import held_suffix_len
from localradix.parsers.events import (
    ChatDelta,
    ContentDelta,
    IdFactory,
    ParsedChatOutput,
    ParsedToolCalls,
    ReasoningContentDelta,
    StreamEvent,
    ToolCall,
    ToolCallDelta,
    new_call_id,
)
from localradix.parsers.structural_tag import (
    ArgsFormat,
    Format,
    Function,
    const,
    either,
    seq,
)
from localradix.parsers.tool_stream import ToolCallStreamParser

START, CHANNEL, MESSAGE, END = "<|start|>", "<|channel|>", "<|message|>", "<|end|>"
CONSTRAIN, CALL, RETURN = "<|constrain|>", "<|call|>", "<|return|>"

_CLOSERS = (END, CALL, RETURN)  # end a message and are consumed with it
_OPENERS = (START, CHANNEL)  # begin the next message: the `<|end|>` before them was left out
_STOPS = _CLOSERS + _OPENERS
# What a header (the text before `<|message|>`) may begin with, after whitespace.
_HEADER_FIRST = (START, CHANNEL, CONSTRAIN, "to=")
# A header is short and on one line: longer or broken text is content, not a header being read.
MAX_HEADER = 256
WHITESPACE = " \t\n\r"
SEPARATOR = "\n\n"  # between two messages of one kind

_CHANNEL_NAME = re.compile(r"<\|channel\|>\s*([^\s<]+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")

REASONING, CONTENT, CALLING = "reasoning", "content", "call"


class HarmonyStreamParser:
    """`feed(delta) -> list[ChatDelta]`, then `finish()`; see the module docstring.

    `tool_names`: the names a call may have; `()` allows none, None any.
    """

    def __init__(
        self,
        tool_names: Collection[str] | None = None,
        id_factory: IdFactory | None = None,
        *,
        complete_calls: bool = False,
    ) -> None:
        self._names = frozenset(tool_names) if tool_names is not None else None
        self._new_id = id_factory or new_call_id
        self._complete_calls = complete_calls
        self._buf = ""
        self._in_header = True  # the output starts with the first message's header
        self._kind = CONTENT  # of the open message
        self._name = ""  # the open call's function
        self._head = ""  # the open call's header as written, shown if it is no call
        self._args = ""  # the open call's text so far
        self._bare = False  # the open body had no header: a marker at its start is its text
        self._said: dict[str, bool] = {REASONING: False, CONTENT: False}  # text sent, by kind
        self._fresh = False  # the open message has sent no text yet
        self._calls = 0
        self._events: list[ChatDelta] = []
        self._finished = False

    def feed(self, text: str) -> list[ChatDelta]:
        if self._finished:
            raise RuntimeError("feed() after finish()")
        self._buf += text
        self._run(final=False)
        return self._drain()

    def finish(self) -> list[ChatDelta]:
        if not self._finished:
            self._finished = True
            self._run(final=True)
        return self._drain()

    # ---- the loop ------------------------------------------------------------------------

    def _run(self, final: bool) -> None:
        while self._header_step(final) if self._in_header else self._body_step(final):
            pass

    def _header_step(self, final: bool) -> bool:
        buf = self._buf
        at = buf.find(MESSAGE)
        head = buf[:at] if at != -1 else buf[: len(buf) - held_suffix_len(buf, (MESSAGE,))]
        if not _may_be_header(head):
            self._open_body(CONTENT, bare=True)  # no header: the text is read as content
            return True
        if at != -1:
            self._buf = buf[at + len(MESSAGE) :]
            self._open_message(head + MESSAGE)
            return True
        if final and buf:  # the output ends inside a header: markup is dropped, text kept
            self._buf = ""
            if buf.strip(WHITESPACE) and not _is_markup(buf):
                self._open_body(CONTENT, bare=True)
                self._buf = buf
                return True
        return False

    def _body_step(self, final: bool) -> bool:
        buf = self._buf
        at, stop = _find_stop(buf, skip_start=self._bare)
        if stop:
            self._body_text(buf[:at])
            self._buf = buf[at + (len(stop) if stop in _CLOSERS else 0) :]
            self._end_message()
            return True
        keep = 0 if final else held_suffix_len(buf, _STOPS)
        self._body_text(buf[: len(buf) - keep])
        self._buf = buf[len(buf) - keep :]
        if final:  # the end of output closes the last message
            self._end_message()
        return False

    # ---- messages ------------------------------------------------------------------------

    def _open_message(self, head: str) -> None:
        channel = _CHANNEL_NAME.search(head)
        recipient = _RECIPIENT.search(head)
        if recipient is not None:
            name = self._function(recipient.group(1))
            if name is None:  # not a call we may make: shown as written
                self._open_body(CONTENT)
                self._body_text(head)
            else:
                self._open_body(CALLING)
                self._name, self._head = name, head
        elif channel is not None and channel.group(1) == "analysis":
            self._open_body(REASONING)
        else:  # final, a commentary preamble, or a channel we do not know: the user sees it
            self._open_body(CONTENT)

    def _function(self, recipient: str) -> str | None:
        """The allowed function a recipient names, if any. A bare name (no `functions.`) is
        taken only when the request's tools list it: `python` or `browser.search` are gpt-oss's
        built-in tools, not functions of ours."""
        name = recipient.removeprefix("functions.")
        bare = name == recipient
        if not name or (self._names is None and bare):
            return None
        return name if self._names is None or name in self._names else None

    def _open_body(self, kind: str, bare: bool = False) -> None:
        self._in_header = False
        self._kind, self._bare, self._fresh = kind, bare, True
        self._args = ""

    def _body_text(self, text: str) -> None:
        if not text:
            return
        self._bare = False
        if self._kind == CALLING:
            self._args += text
            return
        if self._fresh and self._said[self._kind]:
            text = SEPARATOR + text
        self._fresh = False
        self._said[self._kind] = True
        delta = ReasoningContentDelta if self._kind == REASONING else ContentDelta
        self._events.append(delta(text))

    def _end_message(self) -> None:
        if self._kind == CALLING:
            self._end_call()
        self._in_header = True
        self._kind, self._bare = CONTENT, False

    def _end_call(self) -> None:
        arguments = self._args.strip(WHITESPACE)
        if _is_json_object(arguments):
            call = ToolCallDelta(self._calls, self._new_id(), self._name, arguments)
            self._events.append(call)
            self._calls += 1
        elif not self._complete_calls:  # shown as written rather than lost
            self._kind = CONTENT
            self._body_text(self._head + self._args)

    def _drain(self) -> list[ChatDelta]:
        events, self._events = _merged(self._events), []
        return events


def parse_harmony(
    text: str,
    tool_names: Collection[str] | None = None,
    id_factory: IdFactory | None = None,
    *,
    complete_calls: bool = False,
) -> ParsedChatOutput:
    """A whole output: the stream machine run over it at once. Never raises."""
    parser = HarmonyStreamParser(tool_names, id_factory, complete_calls=complete_calls)
    reasoning: list[str] = []
    content: list[str] = []
    calls: list[ToolCall] = []
    for event in parser.feed(text) + parser.finish():
        if isinstance(event, ReasoningContentDelta):
            reasoning.append(event.text)
        elif isinstance(event, ContentDelta):
            content.append(event.text)
        else:
            calls.append(ToolCall(event.id or "", event.name or "", event.arguments))
    return ParsedChatOutput("".join(reasoning) if reasoning else None, "".join(content), calls)


# ---- text tests ------------------------------------------------------------------------------


def _may_be_header(head: str) -> bool:
    """Whether `head` (the text since a message began, up to `<|message|>` or all of it if that
    has not come) is, or may still grow into, a header. Once False it stays False whatever
    follows, so the answer never depends on how the output was split."""
    text = head.lstrip(WHITESPACE)
    if len(head) > MAX_HEADER:  # whitespace counts: held text stays short
        return False
    if not text:
        return True
    if "\n" in text or any(c in text for c in _CLOSERS):
        return False
    if START in text[1:] or text.count(CHANNEL) > 1:  # a second message began
        return False
    return any(text.startswith(f) or f.startswith(text) for f in _HEADER_FIRST)


def _is_markup(head: str) -> bool:
    """A header cut off by the end of output: dropped if it holds a marker or a recipient."""
    return "<|" in head or head.lstrip(WHITESPACE).startswith("to=")


def _find_stop(buf: str, skip_start: bool) -> tuple[int, str]:
    """The first marker that ends a body; `skip_start`: one at offset 0 is text (a body with
    no header begins there, and it must not end before it started)."""
    best, found = len(buf), ""
    for stop in _STOPS:
        at = buf.find(stop, 1 if skip_start and stop in _OPENERS else 0)
        if at != -1 and at < best:
            best, found = at, stop
    return best, found


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _merged(events: list[ChatDelta]) -> list[ChatDelta]:
    """Neighbouring reasoning (or content) deltas as one."""
    out: list[ChatDelta] = []
    for event in events:
        last = out[-1] if out else None
        if isinstance(event, ReasoningContentDelta) and isinstance(last, ReasoningContentDelta):
            out[-1] = ReasoningContentDelta(last.text + event.text)
        elif isinstance(event, ContentDelta) and isinstance(last, ContentDelta):
            out[-1] = ContentDelta(last.text + event.text)
        else:
            out.append(event)
    return out


# ---- the registry's view, and forced calls ---------------------------------------------------


def forced_format(functions: list[Function], many: bool, args: ArgsFormat) -> Format:
    """One call of one of `functions`. A generation ends at `<|call|>`, so there is one call
    whatever `many` says. The header is the one the chat template writes
    (` to=functions.NAME<|channel|>commentary json`) or the one gpt-oss writes itself
    (`<|channel|>commentary to=functions.NAME <|constrain|>json`). The optional analysis
    message before it is the "harmony" reasoning dialect's (tool_constraint adds it)."""
    calls = [
        seq(
            either(
                [
                    const(f" to=functions.{name}{CHANNEL}commentary json{MESSAGE}"),
                    const(f"{CHANNEL}commentary to=functions.{name} {CONSTRAIN}json{MESSAGE}"),
                ]
            ),
            args(schema),
        )
        for name, schema in functions
    ]
    return either(calls)


class HarmonyToolParser(ToolCallStreamParser):
    """The harmony entry of the tool-parser registry: its name, the special tokens the
    detokenizer must keep, and its forced format. As a bare tool parser it sends the content
    and the calls and leaves the analysis channel out (reasoning is no tool-call event);
    `ChatOutputParser` uses `HarmonyStreamParser` itself, reasoning included."""

    name = "harmony"
    special_markers = (START, CHANNEL, MESSAGE, END, CONSTRAIN, CALL, RETURN)
    forced_format = staticmethod(forced_format)

    def __init__(
        self,
        tool_names: Collection[str] | None = None,
        id_factory: IdFactory | None = None,
        *,
        complete_calls: bool = False,
        tool_schemas: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(tool_names, id_factory, complete_calls=complete_calls)
        self._harmony = HarmonyStreamParser(tool_names, id_factory, complete_calls=complete_calls)

    def feed(self, text: str) -> list[StreamEvent]:
        return _tool_events(self._harmony.feed(text))

    def finish(self) -> list[StreamEvent]:
        return _tool_events(self._harmony.finish())

    @classmethod
    def parse(
        cls,
        text: str,
        tool_names: Collection[str] | None = None,
        id_factory: IdFactory | None = None,
        *,
        complete_calls: bool = False,
        tool_schemas: Mapping[str, Any] | None = None,
    ) -> ParsedToolCalls:
        parsed = parse_harmony(text, tool_names, id_factory, complete_calls=complete_calls)
        return ParsedToolCalls(parsed.content, parsed.calls)


def _tool_events(events: list[ChatDelta]) -> list[StreamEvent]:
    return [e for e in events if not isinstance(e, ReasoningContentDelta)]
