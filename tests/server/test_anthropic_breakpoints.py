"""cache_control breakpoints without a server: where each cuts the request, which TTL it asks,
what counts as newly cached, and the 400s."""

from __future__ import annotations

import msgspec
import pytest

from localradix.messages import CachePin
from localradix.server.anthropic.cache_control import (
    breakpoints,
    creation_by_ttl,
    creation_tokens,
)
from localradix.server.anthropic.protocol import MessagesRequest
from localradix.server.errors import APIError

MARK = {"type": "ephemeral"}


def request(**fields) -> MessagesRequest:
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    return msgspec.convert({**body, **fields}, MessagesRequest)


def test_each_breakpoint_cuts_the_request_after_its_block_in_prompt_order():
    req = request(
        tools=[{"name": "a", "cache_control": MARK}, {"name": "b"}],
        system=[
            {"type": "text", "text": "s0"},
            {"type": "text", "text": "s1", "cache_control": MARK},
        ],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "u0", "cache_control": MARK}]},
            {"role": "assistant", "content": "a0"},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t",
                        "content": [
                            {"type": "text", "text": "r", "cache_control": {**MARK, "ttl": "1h"}}
                        ],
                    },
                    {"type": "text", "text": "u1"},
                ],
            },
        ],
    )
    tool, system, first, nested = breakpoints(req)
    assert [t.name for t in tool.cut.tools] == ["a"] and tool.cut.system is None
    assert not tool.cut.messages
    assert len(system.cut.system) == 2 and len(system.cut.tools) == 2 and not system.cut.messages
    assert [m.content[0].text for m in first.cut.messages] == ["u0"]
    assert len(nested.cut.messages) == 3 and len(nested.cut.messages[2].content) == 1
    assert [b.ttl_s for b in (tool, system, first, nested)] == [300, 300, 300, 3600]


def test_no_marks_no_breakpoints():
    assert breakpoints(request(system="plain")) == []


@pytest.mark.parametrize(
    ("control", "message"),
    [
        ({"type": "persistent"}, "system[0].cache_control.type must be 'ephemeral'"),
        ({"type": "ephemeral", "ttl": "2h"}, "system[0].cache_control.ttl must be '5m' or '1h'"),
    ],
)
def test_a_malformed_mark_is_a_400_naming_it(control, message):
    with pytest.raises(APIError, match=message.replace("[", r"\[").replace("]", r"\]")) as err:
        breakpoints(request(system=[{"type": "text", "text": "s", "cache_control": control}]))
    assert err.value.status == 400


def test_at_most_four_breakpoints():
    blocks = [{"type": "text", "text": f"s{i}", "cache_control": MARK} for i in range(5)]
    assert len(breakpoints(request(system=blocks[:4]))) == 4
    with pytest.raises(APIError, match="A maximum of 4 blocks with cache_control"):
        breakpoints(request(system=blocks))


def test_creation_counts_the_pinned_tokens_the_cache_did_not_have():
    pins = (CachePin(100, 300.0), CachePin(250, 300.0))
    assert creation_tokens(pins, cached=0) == 250
    assert creation_tokens(pins, cached=120) == 130
    assert creation_tokens(pins, cached=300) == 0
    assert creation_tokens((), cached=0) == 0


@pytest.mark.parametrize(
    ("cached", "five", "hour"),
    [(0, 20, 100), (50, 20, 50), (100, 20, 0), (115, 5, 0), (200, 0, 0)],
)
def test_creation_splits_by_the_ttl_of_the_breakpoint_that_ends_each_stretch(cached, five, hour):
    pins = (CachePin(120, 300.0), CachePin(100, 3600.0))  # tools+system for 1h, then 5m
    split = creation_by_ttl(pins, cached)
    assert split == {"ephemeral_5m_input_tokens": five, "ephemeral_1h_input_tokens": hour}
    assert five + hour == creation_tokens(pins, cached)
