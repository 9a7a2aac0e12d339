"""How a chat job's output splits into reasoning, content and tool calls, and the grammar a
forced tool_choice adds. Every dialect renders from these parses."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from localradix.parsers.events import ToolCall
from localradix.parsers.output_parser import ChatOutputParser, ParsedChatOutput, parse_chat_output
from localradix.parsers.reasoning import get_reasoning_parser
from localradix.parsers.tool_constraint import ToolChoiceError, tool_call_constraint
from localradix.sampling_params import Constraint
from localradix.server.core.chat_request import ChatRequest
from localradix.server.errors import bad_request
from localradix.server.tokenizer_manager import TokenizerManager


@dataclass(frozen=True)
class ChatOutputSpec:
    """How a chat job's outputs are split into reasoning, content and tool calls."""

    tool_parser: str | None = None
    reasoning_parser: str | None = None
    starts_in_reasoning: bool | None = None
    tool_names: tuple[str, ...] | None = None
    tool_schemas: dict[str, Any] | None = None  # name -> parameters: types XML-style values

    # Calls are sent whole once complete, and a call the output cuts off (max_tokens) is
    # dropped, never shown as content or as a call with broken arguments.
    def stream_parser(self) -> ChatOutputParser:
        return ChatOutputParser(
            tool_parser=self.tool_parser,
            reasoning_parser=self.reasoning_parser,
            starts_in_reasoning=self.starts_in_reasoning,
            tool_names=self.tool_names,
            complete_calls=True,
            tool_schemas=self.tool_schemas,
        )

    def parse(self, text: str) -> ParsedChatOutput:
        if self.tool_parser is None and self.reasoning_parser is None:
            return ParsedChatOutput(None, text)
        return parse_chat_output(
            text,
            tool_parser=self.tool_parser,
            reasoning_parser=self.reasoning_parser,
            starts_in_reasoning=self.starts_in_reasoning,
            tool_names=self.tool_names,
            complete_calls=True,
            tool_schemas=self.tool_schemas,
        )


PLAIN_OUTPUT = ChatOutputSpec()


def call_arguments(call: ToolCall) -> dict[str, Any]:
    """A parsed call's arguments as a JSON object (the Ollama and Anthropic shape), not text."""
    try:
        value = json.loads(call.arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def output_spec(job: Any) -> ChatOutputSpec:
    """The job's output spec (plain text for completion jobs)."""
    return job.output or PLAIN_OUTPUT


def tool_setup(
    manager: TokenizerManager, chat: ChatRequest, prompt: str
) -> tuple[ChatOutputSpec, Constraint | None]:
    """The output parsers for this request, and the constraint its tool_choice forces."""
    tools = chat.tools
    choice = chat.tool_choice
    if choice is None:
        choice = "auto" if tools else "none"
    reasoning = manager.reasoning_parser
    starts = get_reasoning_parser(reasoning).prompt_opens_reasoning(prompt) if reasoning else None
    dialect = manager.tool_parser if tools and choice != "none" else None
    constraint = None
    if choice not in ("none", "auto"):
        if manager.tool_parser is None:
            raise bad_request(
                "this tool_choice needs a tool-call parser, but the server runs with "
                "--tool-call-parser none",
                chat.names("tool_choice"),
            )
        try:
            constraint = tool_call_constraint(
                tools,
                choice,
                manager.tool_parser,
                chat.parallel_tool_calls,
                reasoning=_grammar_reasoning(reasoning, bool(starts), chat.reasoning_effort),
                starts_in_reasoning=bool(starts),
            )
        except ToolChoiceError as exc:
            raise bad_request(str(exc), chat.names("tool_choice")) from None
        dialect = manager.tool_parser
    names = chat.tool_names if dialect else None
    schemas = chat.tool_schemas if dialect else None
    return ChatOutputSpec(dialect, reasoning, starts, names, schemas), constraint


def _grammar_reasoning(reasoning: str | None, starts: bool, effort: str | None) -> str | None:
    """The reasoning a forced call may write first: none with reasoning_effort "none", unless
    the prompt already opened the block (then the grammar must let the model close it)."""
    return None if effort == "none" and not starts else reasoning
