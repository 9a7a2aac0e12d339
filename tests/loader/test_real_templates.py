"""The real chat templates llama.cpp ships (`models/templates/*.jinja`, ~70 families) render in
our sandbox: with system, user, assistant, tool-call, tool-result and reasoning messages, with
tools and without. The few that fail refuse the conversation themselves (a `raise_exception`, a
variable only their own client sets): the server turns that into a 400 that quotes it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from localradix.loader.chat_template import render_chat_template

TESTS = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("_localradix_llama_sdist", TESTS / "llama_sdist.py")
assert spec is not None and spec.loader is not None
llama_sdist = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = llama_sdist
spec.loader.exec_module(llama_sdist)

pytestmark = pytest.mark.skipif(
    llama_sdist.llama_version() is None, reason="llama-cpp-python is not installed"
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather",
        "arguments": {"city": "Paris"}}}  # fmt: skip
CONVERSATIONS = {
    "plain": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Weather?"},
    ],
    "tool round": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": '{"t": 21}'},
        {"role": "user", "content": "Thanks"},
    ],
    "reasoning": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Adding two and two."},
        {"role": "user", "content": "3+3?"},
    ],
}
# Templates that refuse some of these conversations themselves (measured: 30 of 420 renders).
REFUSALS = {
    "CohereForAI-c4ai-command-r-plus-tool_use": "tool-use only, its own tool format",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": "tool-use only: loops over `tools`",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": "tool-use only: loops over `tools`",
    "fireworks-ai-llama-3-firefunction-v2": "reads `functions`, which only its client sets",
    "google-gemma-2-2b-it": "raises 'System role not supported'",
    "Mistral-Small-3.2-24B-Instruct-2506": "raises on roles that do not alternate",
    "mistralai-Mistral-Nemo-Instruct-2407": "raises on roles that do not alternate",
    "mistralai-Ministral-3-14B-Reasoning-2512": "raises on roles that do not alternate",
    "meetkai-functionary-medium-v3.2": "wants `arguments` as text, not the object HF templates take",
}
# The families agents run in 2026: every conversation, with tools and without, must render.
MUST_RENDER = (
    "Qwen3.5-4B", "Qwen3-Coder", "Qwen-Qwen3-0.6B", "google-gemma-4-31B-it", "openai-gpt-oss-120b",
    "deepseek-ai-DeepSeek-V3.1", "deepseek-ai-DeepSeek-V3.2", "GLM-4.6", "GLM-4.7-Flash",
    "Kimi-K2-Instruct", "Kimi-K2-Thinking", "moonshotai-Kimi-K2", "MiniMax-M2",
    "unsloth-mistral-Devstral-Small-2507", "meta-llama-Llama-3.3-70B-Instruct",
    "microsoft-Phi-3.5-mini-instruct", "ibm-granite-granite-4.0",
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "HuggingFaceTB-SmolLM3-3B", "LFM2-8B-A1B",
    "llama-cpp-deepseek-r1",
)  # fmt: skip


def _templates() -> dict[str, str]:
    folder = llama_sdist.llama_cpp_tree() / "models" / "templates"
    return {p.stem: p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.jinja"))}


def _render(source: str, messages: list[dict], tools: list[dict] | None) -> str:
    return render_chat_template(
        source,
        messages=messages,
        tools=tools,
        add_generation_prompt=True,
        bos_token="<s>",
        eos_token="</s>",
    )


def test_every_template_renders_or_refuses_by_its_own_rule() -> None:
    templates = _templates()
    assert len(templates) >= 60, f"only {len(templates)} templates found"
    failed: dict[str, str] = {}
    for name, source in templates.items():
        for label, messages in CONVERSATIONS.items():
            for tools in (None, TOOLS):
                try:
                    assert _render(source, messages, tools).strip()
                except Exception as exc:
                    failed[name] = f"{label}, tools={tools is not None}: {exc}"
    unexpected = {n: why for n, why in failed.items() if n not in REFUSALS}
    assert not unexpected, unexpected
    assert not set(MUST_RENDER) & set(failed)
    assert set(MUST_RENDER) <= set(templates)


def test_a_template_may_grow_its_own_lists_but_not_the_callers() -> None:
    source = (
        "{% set ns = namespace(seen=[]) %}{% for m in messages %}{% set _ = ns.seen.append("
        "m.role) %}{% set _ = m.update({'content': 'changed'}) %}{% endfor %}"
        "{{ ns.seen | join(',') }}|{{ messages | map(attribute='role') | tojson }}"
    )
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert _render(source, messages, None) == 'user,assistant|["user", "assistant"]'
    assert messages[0]["content"] == "hi"


def test_the_sandbox_still_refuses_what_is_unsafe() -> None:
    with pytest.raises(Exception, match="unsafe"):
        _render("{{ messages.__class__.__mro__ }}", [], None)
