"""What the radix cache keeps of the prompts coding agents send, turn after turn.

Agents rebuild their whole prompt every request, and some change it in ways that defeat a
prefix cache. Against a real server on the bundled model this measures, for each pattern, the
prompt tokens a request read from the cache (the `usage` its dialect reports):

- claude-code: Anthropic Messages whose first system block starts with Claude Code's
  `x-anthropic-billing-header: ...; cch=<new every request>` line, then a ~2k-token system
  prompt and tools; second request with a new cch (the line is dropped by default; a second
  server with --keep-billing-header shows what it costs).
- timestamp: an OpenAI chat whose first system line is the current time (a second later on
  the second request), then the same ~2k-token system prompt.
- rewritten-middle: OpenCode-style: the system prompt's environment block in the middle
  (working directory, date, git status) changes between turns; head and tail do not.
- side-call: a title-generation call sharing only the start of the main system prompt, then
  the main conversation's next turn: does the side call cost the main branch its cache?

    python benchmarks/bench_agent_prompts.py [--model PATH] [--backend auto]
"""

from __future__ import annotations

import argparse
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

WORDS = (
    "agent repository function module test build cache prefix token request server model "
    "tool schema argument response stream radix tree scheduler batch decode prefill kernel "
    "memory budget context window file path edit diff commit branch review lint type error"
).split()


def filler(seed: int, words: int) -> str:
    rng = random.Random(seed)
    lines = []
    for _ in range(words // 12):
        lines.append("- " + " ".join(rng.choice(WORDS) for _ in range(12)) + ".")
    return "\n".join(lines)


SYSTEM_HEAD = "You are a coding agent working in the user's repository.\n" + filler(1, 1000)
SYSTEM_TAIL = "# Rules\n" + filler(2, 500)
TOOLS = [
    {
        "name": f"tool_{i}",
        "description": filler(10 + i, 24),
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["path"],
        },
    }
    for i in range(6)
]
OPENAI_TOOLS = [
    {"type": "function", "function": {"name": t["name"], "description": t["description"],
                                      "parameters": t["input_schema"]}}
    for t in TOOLS
]  # fmt: skip


def environment(turn: int) -> str:
    return (
        f"<env>\nWorking directory: /home/user/project\nToday: 2026-12-0{4 + turn}\n"
        f"Git status: {turn} files modified, last commit {1000 + 7 * turn:x}\n</env>"
    )


MODEL = ["default"]  # the served model's id, read from /v1/models


# ---- the server --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def server(extra: list[str], model: str | None, backend: str) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "localradix", "serve", *([model] if model else [])]
    cmd += ["--backend", backend, "--port", str(port), *extra]
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                log.seek(0)
                raise SystemExit(f"server exited:\n{log.read().decode()[-3000:]}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        MODEL[0] = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        yield url
    finally:
        proc.terminate()
        proc.wait(60)


# ---- requests ------------------------------------------------------------------------------


def anthropic(url: str, system: str, user: str) -> tuple[int, int]:
    body = {
        "model": MODEL[0],
        "max_tokens": 4,
        "temperature": 0,
        "system": [{"type": "text", "text": system}],
        "tools": TOOLS,
        "messages": [{"role": "user", "content": user}],
    }
    usage = httpx.post(url + "/v1/messages", json=body, timeout=600).json()["usage"]
    total = usage["input_tokens"] + usage.get("cache_read_input_tokens", 0)
    return usage.get("cache_read_input_tokens", 0), total


def openai(url: str, messages: list[dict[str, Any]], tools: bool = True) -> tuple[int, int]:
    body: dict[str, Any] = {"model": MODEL[0], "max_tokens": 4, "temperature": 0}
    body["messages"] = messages
    if tools:
        body["tools"] = OPENAI_TOOLS
    usage = httpx.post(url + "/v1/chat/completions", json=body, timeout=600).json()["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return cached, usage["prompt_tokens"]


def billing(cch: str) -> str:
    return f"x-anthropic-billing-header: cc_version=2.1.0; cc_entrypoint=cli; cch={cch};\n"


# ---- the patterns --------------------------------------------------------------------------


def claude_code(url: str) -> tuple[int, int]:
    system = SYSTEM_HEAD + "\n" + SYSTEM_TAIL
    anthropic(url, billing("a1b2c") + system, "List the files.")
    return anthropic(url, billing("f9e8d") + system, "List the files.")


def timestamp(url: str) -> tuple[int, int]:
    system = SYSTEM_HEAD + "\n" + SYSTEM_TAIL

    def at(t: str) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": f"Current time: 2026-12-04T23:59:{t}Z\n" + system},
            {"role": "user", "content": "List the files."},
        ]

    openai(url, at("01"))
    return openai(url, at("02"))


def rewritten_middle(url: str) -> tuple[int, int]:
    def turn(n: int) -> list[dict[str, Any]]:
        system = SYSTEM_HEAD + "\n" + environment(n) + "\n" + SYSTEM_TAIL
        return [{"role": "system", "content": system}, {"role": "user", "content": "Go on."}]

    openai(url, turn(0))
    return openai(url, turn(1))


def side_call(url: str) -> tuple[tuple[int, int], tuple[int, int]]:
    system = SYSTEM_HEAD + "\n" + SYSTEM_TAIL
    first = [{"role": "system", "content": system}, {"role": "user", "content": "Fix the bug."}]
    openai(url, first)
    title_system = SYSTEM_HEAD[:400] + "\nGenerate a short title for this conversation."
    title = [
        {"role": "system", "content": title_system},
        {"role": "user", "content": "Fix the bug."},
    ]
    side = openai(url, title, tools=False)
    follow = [
        *first,
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "Test it."},
    ]
    return side, openai(url, follow)


def report(name: str, cached: int, total: int, note: str = "") -> None:
    share = cached / total if total else 0.0
    print(f"{name:34s} {cached:6d} / {total:6d} cached ({share:6.1%}) {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="default: the bundled model")
    parser.add_argument("--backend", default="auto")
    args = parser.parse_args()
    print("second request of each pattern: prompt tokens read from the radix cache")
    with server([], args.model, args.backend) as url:
        report("claude-code (new cch)", *claude_code(url), "billing line dropped")
        report("timestamp first line", *timestamp(url))
        report("rewritten middle (OpenCode env)", *rewritten_middle(url))
        side, follow = side_call(url)
        report("side call (title, shared start)", *side)
        report("main turn after the side call", *follow)
    with server(["--keep-billing-header"], args.model, args.backend) as url:
        report("claude-code, --keep-billing-header", *claude_code(url), "line kept")


if __name__ == "__main__":
    main()
