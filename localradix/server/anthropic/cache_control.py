"""Anthropic `cache_control` breakpoints as radix-cache pins.

A block (tool, system block or message content block) marked `{"type": "ephemeral", "ttl"?:
"5m" | "1h"}` asks that the prompt prefix through that block stay cached for the TTL. Its length
in tokens is the common token prefix of the full prompt and the conversation cut after that block,
rendered by the same template path (so whatever the template writes around a block is counted
the same way). The engine pins that prefix once the prompt is cached (`CachePin`); usage reports
the pinned tokens that were not cached before as `cache_creation_input_tokens`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from msgspec.structs import replace

from localradix.messages import CachePin
from localradix.server.anthropic.protocol import Block, Message, MessagesRequest
from localradix.server.anthropic.request import chat_request
from localradix.server.core.chat_template import chat_text
from localradix.server.core.jobs import encode_prompt
from localradix.server.errors import APIError, bad_request
from localradix.server.tokenizer_manager import TokenizerManager

FIVE_MINUTES_S = 300.0
TTLS: dict[Any, float] = {None: FIVE_MINUTES_S, "5m": FIVE_MINUTES_S, "1h": 3600.0}
MAX_BREAKPOINTS = 4  # Anthropic's limit


@dataclass(frozen=True)
class Breakpoint:
    ttl_s: float
    cut: MessagesRequest  # the request cut right after the marked block


def _ttl(control: dict[str, Any] | None, where: str) -> float | None:
    """The TTL a block's cache_control asks for (None: the block is not marked)."""
    if control is None:
        return None
    if control.get("type") != "ephemeral":
        raise bad_request(f"{where}.type must be 'ephemeral', not {control.get('type')!r}")
    ttl = control.get("ttl")
    if ttl not in TTLS:
        raise bad_request(f"{where}.ttl must be '5m' or '1h', not {ttl!r}")
    return TTLS[ttl]


def _block_ttl(block: Block, where: str) -> float | None:
    """A content block's TTL; a mark on a block nested in a tool_result marks the result."""
    ttls = [_ttl(block.cache_control, f"{where}.cache_control")]
    if isinstance(block.content, list):
        ttls += [
            _block_ttl(inner, f"{where}.content[{k}]") for k, inner in enumerate(block.content)
        ]
    return max((t for t in ttls if t is not None), default=None)


def breakpoints(req: MessagesRequest) -> list[Breakpoint]:
    """The request's cache_control breakpoints in prompt order (tools, system, messages); a
    400 on a malformed one or on more than four."""
    out: list[Breakpoint] = []
    tools = req.tools or []
    for i, tool in enumerate(tools):
        ttl = _ttl(tool.cache_control, f"tools[{i}].cache_control")
        if ttl is not None:
            cut = replace(req, tools=tools[: i + 1], system=None, messages=[])
            out.append(Breakpoint(ttl, cut))
    if isinstance(req.system, list):
        for k, block in enumerate(req.system):
            ttl = _block_ttl(block, f"system[{k}]")
            if ttl is not None:
                out.append(Breakpoint(ttl, replace(req, system=req.system[: k + 1], messages=[])))
    for i, msg in enumerate(req.messages):
        blocks = [] if isinstance(msg.content, str) else msg.content
        for j, block in enumerate(blocks):
            ttl = _block_ttl(block, f"messages[{i}].content[{j}]")
            if ttl is not None:
                turns = [*req.messages[:i], Message(msg.role, blocks[: j + 1])]
                out.append(Breakpoint(ttl, replace(req, messages=turns)))
    if len(out) > MAX_BREAKPOINTS:
        raise bad_request(
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {len(out)}."
        )
    return out


async def cache_pins(
    manager: TokenizerManager, marks: list[Breakpoint], ids: list[int]
) -> tuple[CachePin, ...]:
    """Each breakpoint as a pin of the prompt `ids`' prefix through its block."""
    pins = []
    for mark in marks:
        text = _cut_text(manager, mark.cut)
        if text is None:
            continue
        n = _common_len(await encode_prompt(manager, text), ids)
        if n > 0:
            pins.append(CachePin(n, mark.ttl_s))
    return tuple(pins)


def _cut_text(manager: TokenizerManager, cut: MessagesRequest) -> str | None:
    """The cut conversation through the template, as a prefix (no generation prompt); None
    if the template refuses it (e.g. one that needs a user turn): that breakpoint pins nothing."""
    empty = not cut.messages
    if empty:  # a request needs a message; this one is dropped again before rendering
        cut = replace(cut, messages=[Message("user", "")])
    chat = chat_request(manager, cut)
    messages = chat.messages[:-1] if empty else chat.messages
    try:
        cut_chat = dataclasses.replace(chat, messages=messages, add_generation_prompt=False)
        return chat_text(manager, cut_chat)
    except APIError:
        return None


def _common_len(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def creation_tokens(pins: tuple[CachePin, ...], cached: int) -> int:
    """Pinned tokens this request wrote to the cache: those it did not find cached."""
    return max((max(0, pin.tokens - cached) for pin in pins), default=0)


def creation_by_ttl(pins: tuple[CachePin, ...], cached: int) -> dict[str, int]:
    """`creation_tokens` split by TTL (usage.cache_creation): the tokens between two breakpoints
    belong to the breakpoint that ends them."""
    out = {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0}
    start = 0
    for pin in sorted(pins, key=lambda p: p.tokens):
        bucket = (
            "ephemeral_1h_input_tokens"
            if pin.ttl_s > FIVE_MINUTES_S
            else "ephemeral_5m_input_tokens"
        )
        out[bucket] += max(0, pin.tokens - max(start, cached))
        start = max(start, pin.tokens)
    return out
