"""Reasoning sent back in the history reaches templates that read it as `thinking` (gpt-oss),
and a tool-call turn with both content and reasoning still renders (gpt-oss refuses both)."""

from __future__ import annotations

import msgspec
import pytest
from parsers.template_turns import requires_templates, template

from localradix.loader.chat_template import render_chat_template
from localradix.server.core.chat_template import template_messages
from localradix.server.protocol import ChatCompletionRequest

CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
TOOLS = [{"type": "function", "function": {"name": "f", "description": "", "parameters": {}}}]


def _render(messages: list[dict]) -> str:
    req = msgspec.convert({"model": "m", "messages": messages}, ChatCompletionRequest)
    return render_chat_template(
        template("openai-gpt-oss-120b"),
        messages=template_messages(req.messages),
        tools=TOOLS,
        add_generation_prompt=True,
    )


@requires_templates
@pytest.mark.parametrize("content", ["", "Calling f."])
def test_reasoning_of_a_tool_call_turn_reaches_gpt_oss(content: str) -> None:
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": content,
            "reasoning_content": "Need f.",
            "tool_calls": [CALL],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    prompt = _render(messages)
    assert "to=functions.f" in prompt
    # Without content the reasoning is the analysis message; with content, content is.
    assert ("<|channel|>analysis<|message|>Need f.<|end|>" in prompt) == (not content)


def test_reasoning_effort_from_every_dialect() -> None:
    """OpenAI's reasoning_effort, Responses' reasoning.effort, Anthropic's thinking switch and
    Ollama's think reach the chat request the same way."""
    from localradix.server.core.chat_template import effort_kwargs
    from localradix.server.responses.protocol import ResponsesRequest
    from localradix.server.responses.request import chat_request

    body = {"input": "hi", "reasoning": {"effort": "none", "summary": "auto"}}
    req = chat_request(
        msgspec.convert(body, ResponsesRequest), "m", [{"role": "user", "content": "hi"}]
    )
    assert req.reasoning_effort == "none"
    assert effort_kwargs("none") == {"reasoning_effort": "low", "enable_thinking": False}
    assert effort_kwargs("high") == {"reasoning_effort": "high"}
    assert effort_kwargs(None) == {}
