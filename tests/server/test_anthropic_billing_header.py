"""Claude Code's billing header does not break the cache: its first system block is
`x-anthropic-billing-header: ...; cch=<a value new every request>`, which would make every
request diverge from the cached prefix at its ~10th token. The server drops that line before
templating (`--keep-billing-header` keeps it), so a 2k-token system prompt and tools after it are
served from the radix cache. Real `anthropic` SDK, bundled model on llama.cpp.
"""

from __future__ import annotations

import httpx
import pytest
from server_harness import start_server

from localradix.server.anthropic.request import _system

anthropic = pytest.importorskip("anthropic")

SYSTEM = " ".join(f"Rule {i}: read the file before you edit it, and say why." for i in range(160))
TOOLS = [
    {
        "name": f"tool_{i}",
        "description": f"Tool number {i} of the agent.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
    for i in range(6)
]


def header(cch: str) -> str:
    return f"x-anthropic-billing-header: cc_version=2.1.0; cc_entrypoint=cli; cch={cch};"


def test_the_header_line_is_dropped_from_strings_and_blocks_alone() -> None:
    from localradix.server.anthropic.protocol import Block

    assert _system(header("1") + "\nYou are an agent.", keep_header=False) == "You are an agent."
    blocks = [Block(type="text", text=header("2")), Block(type="text", text="You are an agent.")]
    assert _system(blocks, keep_header=False) == "You are an agent."
    assert _system(blocks, keep_header=True) == header("2") + "You are an agent."
    assert _system("Mentions x-anthropic-billing-header: mid-text.", False).startswith("Mentions")


@pytest.mark.slow
@pytest.mark.parametrize("keep", [False, True])
def test_a_new_cch_every_request_still_hits_the_cache(keep: bool) -> None:
    args = ["--backend", "llamacpp", "--max-total-tokens", "8192"]
    server = start_server([*args, "--keep-billing-header"] if keep else args, fake=False)
    try:
        ac = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
        name = httpx.get(server.url + "/v1/models").json()["data"][0]["id"]
        usages = []
        for cch in ("a1b2c", "f9e8d"):
            system = [{"type": "text", "text": header(cch)}, {"type": "text", "text": SYSTEM}]
            reply = ac.messages.create(
                model=name,
                max_tokens=2,
                system=system,
                tools=TOOLS,
                messages=[{"role": "user", "content": f"Task {cch}: list the files."}],
                extra_body={"temperature": 0},
            )
            usages.append(reply.usage)
        # The prompt without the 2k-token system text: all a cached prefix ending at the
        # line's new value could hold (the tools the server writes first, the line's start).
        without = ac.messages.count_tokens(
            model=name,
            system=[{"type": "text", "text": header("f9e8d")}],
            tools=TOOLS,
            messages=[{"role": "user", "content": "Task f9e8d: list the files."}],
        ).input_tokens
    finally:
        assert server.stop() == 0, server.log()[-3000:]
    second = usages[1]
    prompt = second.input_tokens + (second.cache_read_input_tokens or 0)
    assert prompt > 2000
    read = second.cache_read_input_tokens or 0
    if keep:  # the header's new value ends the cached prefix: none of the system text is read
        assert read < without < 0.25 * prompt, (read, without, prompt)
    else:
        assert read >= 0.9 * prompt, (read, prompt)
