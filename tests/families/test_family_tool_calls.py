"""Agents on the 2026 families: a forced tool call through real clients, on each family's tiny
random-weight GGUF served with that family's real chat template (llama.cpp ships them).

For every (family, template) pair: `localradix serve MODEL --backend llamacpp --chat-template
TEMPLATE` detects the template's tool-call dialect, and a `tool_choice` that forces a call
(OpenAI "required" and a named function, Anthropic {"type": "any"}, Ollama's `options.tool_choice`, a localradix
extension: Ollama's API has none) yields a parsed call whose arguments are valid against the
tool's schema, through the openai, anthropic and ollama client libraries. The weights are
random, so only the grammar makes the model call: what is checked is that the grammar writes
the dialect as the template does and the parser reads it back.

Templates of families without a fixture here (DeepSeek, GLM, Kimi, MiniMax) are served on the
llama fixture: the architecture does not matter to the template and the parsers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import requires_llama_cpp

pytestmark = [pytest.mark.slow, requires_llama_cpp]

# (fixture family, llama.cpp template, the dialect auto-detection must pick)
CASES = [
    ("qwen3_5", "Qwen3.5-4B", "qwen3-coder"),
    ("qwen3_moe", "Qwen3-Coder", "qwen3-coder"),
    ("qwen3", "Qwen-Qwen3-0.6B", "hermes"),
    ("gpt_oss", "openai-gpt-oss-120b", "harmony"),
    ("gemma4_text", "google-gemma-4-31B-it", "gemma4"),
    ("granitemoehybrid", "ibm-granite-granite-4.0", "hermes"),
    ("mixtral", "unsloth-mistral-Devstral-Small-2507", "mistral-v11"),
    ("llama", "meta-llama-Llama-3.3-70B-Instruct", "llama3"),
    ("phi3", "microsoft-Phi-3.5-mini-instruct", "generic"),
    # llama.cpp's copy of this template writes no tools: the server writes them (generic).
    ("llama", "deepseek-ai-DeepSeek-V3.1", "generic"),
    ("llama", "deepseek-ai-DeepSeek-V3.2", "deepseek-v3.2"),
    ("llama", "GLM-4.7-Flash", "glm45"),
    ("llama", "moonshotai-Kimi-K2", "kimi-k2"),
    ("llama", "MiniMax-M2", "minimax-m2"),
]
# Bounded choices: a random model under the grammar ends its call in a few dozen tokens.
SCHEMA = {
    "type": "object",
    "properties": {
        "mode": {"type": "string", "enum": ["fast", "safe"]},
        "level": {"type": "integer", "enum": [1, 2, 3]},
        "dry_run": {"type": "boolean"},
    },
    "required": ["mode", "level", "dry_run"],
    "additionalProperties": False,
}
NAME = "set_mode"
MAX_TOKENS = 400
MESSAGES = [{"role": "user", "content": "Switch to the safe mode, level 2."}]


def _model(server: Any) -> str:
    import httpx

    return str(httpx.get(server.url + "/v1/models").json()["data"][0]["id"])


def _valid(arguments: Any) -> None:
    import jsonschema

    jsonschema.validate(arguments, SCHEMA)


def _template_path(name: str) -> Path:
    from parsers.template_turns import llama_sdist

    return llama_sdist.llama_cpp_tree() / "models" / "templates" / f"{name}.jinja"


@pytest.fixture(scope="module", params=CASES, ids=[f"{f}-{t}" for f, t, _ in CASES])
def served(request: Any, gguf_path: Callable[[str], Path]) -> Iterator[tuple[Any, str]]:
    from server.server_harness import start_server

    family, template, dialect = request.param
    args = [str(gguf_path(family)), "--backend", "llamacpp", "--threads", "2"]
    args += ["--chat-template", str(_template_path(template))]
    server = start_server(args, fake=False)
    try:
        yield server, dialect
    finally:
        server.stop()


def test_the_dialect_is_detected_from_the_template(served: tuple[Any, str]) -> None:
    server, dialect = served
    log = server.log()
    assert f"tool-call parser: {dialect}" in log, log[-2000:]


def test_openai_sdk_forced_call(served: tuple[Any, str]) -> None:
    import json

    from openai import OpenAI

    server, _ = served
    client = OpenAI(base_url=server.url + "/v1", api_key="none")
    tools = [{"type": "function", "function": {"name": NAME, "parameters": SCHEMA}}]
    for choice in ("required", {"type": "function", "function": {"name": NAME}}):
        reply = client.chat.completions.create(
            model=_model(server),
            messages=MESSAGES,  # type: ignore[arg-type]
            tools=tools,  # type: ignore[arg-type]
            tool_choice=choice,  # type: ignore[arg-type]
            parallel_tool_calls=False,  # one call: a random model may go on calling
            reasoning_effort="none",  # no reasoning first: a random model never ends it
            max_tokens=MAX_TOKENS,
            temperature=0,
        )
        message = reply.choices[0].message
        assert message.tool_calls, (choice, message)
        call = message.tool_calls[0]
        assert call.function.name == NAME
        _valid(json.loads(call.function.arguments))
        assert reply.choices[0].finish_reason == "tool_calls"


def test_anthropic_sdk_forced_call(served: tuple[Any, str]) -> None:
    from anthropic import Anthropic

    server, _ = served
    client = Anthropic(base_url=server.url, api_key="none")
    reply = client.messages.create(
        model=_model(server),
        messages=MESSAGES,  # type: ignore[arg-type]
        tools=[{"name": NAME, "description": "Set the mode", "input_schema": SCHEMA}],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        thinking={"type": "disabled"},
        max_tokens=MAX_TOKENS,
    )
    uses = [block for block in reply.content if block.type == "tool_use"]
    assert uses, reply
    assert uses[0].name == NAME
    _valid(uses[0].input)
    assert reply.stop_reason == "tool_use"


def test_ollama_client_forced_call(served: tuple[Any, str]) -> None:
    import ollama

    server, _ = served
    client = ollama.Client(host=server.url)
    tools = [{"type": "function", "function": {"name": NAME, "parameters": SCHEMA}}]
    reply = client.chat(
        model=_model(server),
        messages=MESSAGES,
        tools=tools,
        think=False,
        options={"tool_choice": "required", "num_predict": MAX_TOKENS, "temperature": 0},
    )
    calls = reply.message.tool_calls
    assert calls, reply
    assert calls[0].function.name == NAME
    _valid(dict(calls[0].function.arguments))
