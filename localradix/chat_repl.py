"""`localradix run NAME`: a chat in the terminal on an in-process engine (no server).

Replies stream as they are generated; after each one a line says how many prompt tokens came
from the radix cache (the whole earlier conversation, from the second turn on). `/bye` (or
Ctrl-D) quits, `\"\"\"` starts and ends a multi-line message, Ctrl-C stops a reply.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from collections.abc import Callable
from typing import Any

FENCE = '"""'
BYE = "/bye"
HELP = f"{BYE} quits; {FENCE} starts and ends a multi-line message; Ctrl-C stops a reply"


def add_run_parser(subparsers: Any) -> None:
    from localradix.config import add_server_args

    p = subparsers.add_parser(
        "run",
        help="chat with a model in the terminal",
        description="Chat with a model in the terminal (streamed; the cache hit is shown after "
        f"each reply). {HELP}.",
    )
    p.add_argument("model", metavar="NAME", nargs="?", default=None,
                   help="an alias, REPO:QUANT, REPO, .gguf file or folder (default: bundled)")  # fmt: skip
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--system", default=None, help="a system message")
    add_server_args(p, skip=("model", "log_level"))
    p.set_defaults(log_level="warning")


def run_chat(ns: argparse.Namespace) -> int:
    from localradix import Engine
    from localradix.config import ServerArgs, args_from_namespace
    from localradix.loader import resolve_model
    from localradix.sampling_params import SamplingParams

    args = args_from_namespace(ns)
    fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(ServerArgs)}
    fields.pop("model")
    params = SamplingParams(max_new_tokens=ns.max_new_tokens, temperature=ns.temperature)
    name = resolve_model(ns.model).name  # cheap: the engine resolves it again to load it
    with Engine(model=ns.model, **fields) as engine:
        print(f"{name} ({HELP})", flush=True)
        chat_loop(engine, params, input, ns.system)
    return 0


def chat_loop(
    engine: Any, params: Any, read: Callable[[str], str], system: str | None = None
) -> None:
    """Read messages with `read` until /bye or end of input; stream each reply to stdout."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    while True:
        text = read_message(read)
        if text is None:
            return
        if not text.strip():
            continue
        messages.append({"role": "user", "content": text})
        try:
            reply, cached, prompt = asyncio.run(_stream_reply(engine, messages, params))
        except KeyboardInterrupt:
            print("\n(stopped)", flush=True)
            messages.pop()
            continue
        messages.append({"role": "assistant", "content": reply})
        print(f"\n[cache hit: {cached} of {prompt} prompt tokens]", flush=True)


def read_message(read: Callable[[str], str]) -> str | None:
    """One message: a line, or the lines between two \"\"\" fences; None for /bye or EOF."""
    try:
        line = read(">>> ")
        if line.strip() == BYE:
            return None
        if not line.lstrip().startswith(FENCE):
            return line
        lines = [line.lstrip()[len(FENCE) :]]
        while not lines[-1].rstrip().endswith(FENCE):
            lines.append(read("... "))
        lines[-1] = lines[-1].rstrip()[: -len(FENCE)]
        return "\n".join(lines).strip("\n")
    except EOFError:
        return None


async def _stream_reply(
    engine: Any, messages: list[dict[str, Any]], params: Any
) -> tuple[str, int, int]:
    ids = engine.chat_ids(messages)
    parts: list[str] = []
    cached = 0
    async for chunk in engine.stream(ids, params):
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
        parts.append(chunk.text)
        if chunk.finished:
            cached = chunk.output.cached_tokens
    return "".join(parts), cached, len(ids)
