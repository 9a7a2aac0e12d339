"""`--tool-call-parser auto` and `--reasoning-parser auto` pick each family's dialect from its
real chat template (llama.cpp's `models/templates`)."""

from __future__ import annotations

import pytest
from template_turns import requires_templates, template

from localradix.parsers.reasoning import detect_reasoning_parser
from localradix.parsers.tool_calls import detect_tool_parser

pytestmark = requires_templates

# template -> (tool-call dialect, reasoning dialect)
EXPECTED = {
    "Qwen3.5-4B": ("qwen3-coder", "qwen3"),
    "Qwen3-Coder": ("qwen3-coder", None),
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": ("qwen3-coder", "qwen3"),
    "Qwen-Qwen3-0.6B": ("hermes", "qwen3"),
    "Qwen-Qwen2.5-7B-Instruct": ("hermes", None),
    "openai-gpt-oss-120b": ("harmony", "harmony"),
    "google-gemma-4-31B-it": ("gemma4", "gemma4"),
    "deepseek-ai-DeepSeek-V3.1": ("deepseek-v3.1", "deepseek-r1"),
    "deepseek-ai-DeepSeek-V3.2": ("deepseek-v3.2", "deepseek-r1"),
    "deepseek-ai-DeepSeek-V4": ("deepseek-v3.2", "deepseek-r1"),
    "GLM-4.6": ("glm45", "qwen3"),
    "GLM-4.7-Flash": ("glm45", "qwen3"),
    "moonshotai-Kimi-K2": ("kimi-k2", None),
    "Kimi-K2-Thinking": ("kimi-k2", "qwen3"),
    "MiniMax-M2": ("minimax-m2", "qwen3"),
    "ibm-granite-granite-3.3-2B-Instruct": ("granite", "qwen3"),
    "ibm-granite-granite-4.0": ("hermes", None),
    "unsloth-mistral-Devstral-Small-2507": ("mistral-v11", None),
    "mistralai-Ministral-3-14B-Reasoning-2512": ("mistral-v11", "magistral"),
    "meta-llama-Llama-3.3-70B-Instruct": ("llama3", None),
    "microsoft-Phi-3.5-mini-instruct": (None, None),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_auto_picks_the_family_dialect(name: str) -> None:
    source = template(name)
    assert (detect_tool_parser(source), detect_reasoning_parser(source)) == EXPECTED[name]
