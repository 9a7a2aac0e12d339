"""Anthropic `cache_control` end to end with the real `anthropic` SDK: a breakpoint pins its prompt
prefix in the radix tree, usage reports what it newly cached (`cache_creation_input_tokens`) and
what the cache served (`cache_read_input_tokens`), and a pinned prefix survives a flood of
other prompts that evicts everything unpinned. One server per module, on the bundled model with
a KV pool of 512 tokens (pins may take half of it), so a few prompts fill it.
"""

from __future__ import annotations

import time

import httpx
import pytest
from server_harness import start_server

anthropic = pytest.importorskip("anthropic")

pytestmark = pytest.mark.slow

GREEDY = {"temperature": 0}
POOL = 512
HELLO = [{"role": "user", "content": "Say hi."}]


def long_text(topic: str, n: int = 10) -> str:
    """About 11 tokens a sentence: a system prompt or a flood prompt of ~11 n tokens."""
    return " ".join(f"Rule {i} about {topic}: answer with care." for i in range(n))


def cached_system(text: str, ttl: str | None = None) -> list[dict]:
    control = {"type": "ephemeral"} | ({"ttl": ttl} if ttl else {})
    return [{"type": "text", "text": text, "cache_control": control}]


@pytest.fixture(scope="module")
def server():
    args = ["--backend", "cpu", "--max-total-tokens", str(POOL), "--max-running-requests", "4"]
    s = start_server(args, fake=False)
    yield s
    assert s.stop() == 0, s.log()[-3000:]


@pytest.fixture(scope="module")
def ac(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def name(server):
    return httpx.get(server.url + "/v1/models").json()["data"][0]["id"]


def ask(ac, name, system, content: str = "Say hi."):
    messages = [{"role": "user", "content": content}]
    extra = {"system": system} if system is not None else {}
    return ac.messages.create(
        model=name, max_tokens=2, messages=messages, extra_body=GREEDY, **extra
    )


def pinned_gauge(server, at_least: int = 0, wait_s: float = 10.0) -> int:
    """The gauge, read again until it reaches `at_least`: /metrics shows the engine's last
    stats snapshot, which can trail the response by a step."""
    deadline = time.monotonic() + wait_s
    while True:
        lines = httpx.get(server.url + "/metrics").text.splitlines()
        found = [ln for ln in lines if ln.startswith("localradix_kv_pinned_tokens ")]
        assert found, "no localradix_kv_pinned_tokens gauge in /metrics"
        value = int(float(found[0].split()[1]))
        if value >= at_least or time.monotonic() > deadline:
            return value
        time.sleep(0.2)


def test_the_first_call_creates_the_cache_and_the_second_reads_it(ac, name, server):
    system = cached_system(long_text("geography"))
    first = ask(ac, name, system)
    counted = ac.messages.count_tokens(model=name, system=system, messages=HELLO).input_tokens
    u = first.usage
    assert u.cache_creation_input_tokens > 80 and u.cache_read_input_tokens < 10
    assert u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens == counted
    assert u.cache_creation.ephemeral_5m_input_tokens == u.cache_creation_input_tokens
    assert u.cache_creation.ephemeral_1h_input_tokens == 0
    created = u.cache_creation_input_tokens
    assert pinned_gauge(server, at_least=created) >= created

    with ac.messages.stream(
        model=name, max_tokens=2, system=system, messages=HELLO, extra_body=GREEDY
    ) as stream:
        again = stream.get_final_message().usage
    assert again.cache_creation_input_tokens == 0
    assert again.cache_read_input_tokens >= u.cache_creation_input_tokens
    assert again.input_tokens + again.cache_read_input_tokens == counted


def test_a_pinned_prefix_survives_a_flood_that_evicts_an_unpinned_one(ac, name):
    pinned = ask(ac, name, cached_system(long_text("history"), ttl="1h"))
    pin_tokens = pinned.usage.cache_creation_input_tokens
    assert pin_tokens > 80
    unpinned_system = long_text("chemistry")
    assert ask(ac, name, unpinned_system).usage.cache_creation_input_tokens == 0
    for i in range(4):  # ~140 tokens each: together more than the pins leave of the pool
        ask(ac, name, None, content=long_text(f"flood {i}", n=12))
    later = ask(ac, name, long_text("history"), content="Another question.")  # no mark
    assert later.usage.cache_read_input_tokens >= pin_tokens
    gone = ask(ac, name, unpinned_system, content="Another question.")
    assert gone.usage.cache_read_input_tokens < 50


def test_breakpoints_on_tools_and_messages_pin_their_prefixes(ac, name):
    tools = [
        {
            "name": "lookup",
            "description": long_text("tools", n=6),
            "input_schema": {"type": "object", "properties": {}},
            "cache_control": {"type": "ephemeral"},
        }
    ]
    turn = {"type": "text", "text": long_text("music", n=6), "cache_control": {"type": "ephemeral"}}
    messages = [{"role": "user", "content": [turn]}]
    kwargs = {"model": name, "max_tokens": 2, "messages": messages, "extra_body": GREEDY}
    first = ac.messages.create(tools=tools, **kwargs).usage
    counted = ac.messages.count_tokens(model=name, tools=tools, messages=messages).input_tokens
    # The message breakpoint covers all but the template's generation prompt.
    assert counted - 10 < first.cache_creation_input_tokens + first.cache_read_input_tokens
    assert ac.messages.create(tools=tools, **kwargs).usage.cache_creation_input_tokens == 0


def test_malformed_or_too_many_breakpoints_are_400s(ac, name):
    block = {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}
    with pytest.raises(anthropic.BadRequestError, match="A maximum of 4 blocks"):
        ask(ac, name, [block] * 5)
    bad_ttl = [{**block, "cache_control": {"type": "ephemeral", "ttl": "2h"}}]
    with pytest.raises(anthropic.BadRequestError, match=r"system\[0\].cache_control.ttl"):
        ask(ac, name, bad_ttl)
    bad_type = [{**block, "cache_control": {"type": "persistent"}}]
    with pytest.raises(anthropic.BadRequestError, match="'ephemeral'"):
        ask(ac, name, bad_type)


@pytest.fixture(scope="module")
def llama_ac():
    """The llama.cpp runner frees cells only on eviction: a pin keeps its cells."""
    pytest.importorskip("llama_cpp")
    args = ["--backend", "llamacpp", "--max-total-tokens", str(POOL)]
    s = start_server(args, fake=False)
    yield anthropic.Anthropic(base_url=s.url, api_key="unused", max_retries=0, timeout=300)
    assert s.stop() == 0, s.log()[-3000:]


def test_llamacpp_keeps_a_pinned_prefix_through_a_flood(llama_ac):
    name = llama_ac.models.list().data[0].id
    pinned = ask(llama_ac, name, cached_system(long_text("history"))).usage
    assert pinned.cache_creation_input_tokens > 80
    ask(llama_ac, name, long_text("chemistry"))
    for i in range(4):
        ask(llama_ac, name, None, content=long_text(f"flood {i}", n=12))
    later = ask(llama_ac, name, long_text("history"), content="Another question.")
    assert later.usage.cache_read_input_tokens >= pinned.cache_creation_input_tokens
    gone = ask(llama_ac, name, long_text("chemistry"), content="Another question.")
    assert gone.usage.cache_read_input_tokens < 50
