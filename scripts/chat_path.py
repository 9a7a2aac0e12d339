"""How much of localradix one chat request walks through: one /v1/chat/completions request,
whole and streamed, through the real app in this process over the tests' fake engine, traced
with sys.setprofile.

Prints, per request: the distinct localradix modules entered from the route handler on, the
distinct localradix functions (defs and lambdas; not comprehensions or dataclasses' generated
methods) entered from the handler up to `TokenizerManager.submit`, and those entered after it
(the engine's deltas to the response bytes).

    python scripts/chat_path.py [openai|anthropic|ollama|responses]   # PYTHONPATH: the tree
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

HERE = Path(__file__).resolve().parent
FAKE = HERE.parent / "tests" / "server"
HELLO = [{"role": "user", "content": "hello"}]
# dialect -> (path, its route handler, a request body)
DIALECTS: dict[str, tuple[str, tuple[str, str], dict[str, Any]]] = {
    "openai": (
        "/v1/chat/completions",
        ("localradix.server.openai.routes", "chat_completions"),
        {"model": "fake-model", "messages": HELLO, "max_tokens": 8, "temperature": 0},
    ),
    "anthropic": (
        "/v1/messages",
        ("localradix.server.anthropic.routes", "create_message"),
        {"model": "fake-model", "messages": HELLO, "max_tokens": 8, "temperature": 0},
    ),
    "ollama": (
        "/api/chat",
        ("localradix.server.ollama.routes", "chat"),
        {"model": "fake-model", "messages": HELLO, "options": {"num_predict": 8}},
    ),
    "responses": (
        "/v1/responses",
        ("localradix.server.responses.routes", "create_response"),
        {"model": "fake-model", "input": "hello", "max_output_tokens": 8, "temperature": 0},
    ),
}
COMPREHENSIONS = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>")
SUBMIT = ("localradix.server.tokenizer_manager", "TokenizerManager.submit")


class Trace:
    """The localradix functions entered, split at the first `submit`."""

    def __init__(self, handler: tuple[str, str]) -> None:
        self.handler = handler
        self.phase: str | None = None  # None: before the handler; "build"; "answer"
        self.seen: dict[str, set[tuple[str, str]]] = {"build": set(), "answer": set()}

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("localradix"):
            return
        where = (module, frame.f_code.co_qualname)
        if where[1].endswith(COMPREHENSIONS) or where[1].startswith("__create_fn__"):
            return  # a comprehension's frame, a dataclass's generated method: no def of ours
        if self.phase is None:
            if where != self.handler:
                return
            self.phase = "build"
        self.seen[self.phase].add(where)
        if where == SUBMIT:
            self.phase = "answer"

    def report(self, title: str) -> None:
        both = self.seen["build"] | self.seen["answer"]
        modules = sorted({m for m, _ in both})
        print(f"{title}:")
        print(f"  localradix modules entered: {len(modules)}")
        print(f"  functions, handler -> submit: {len(self.seen['build'])}")
        print(f"  functions, deltas -> bytes:   {len(self.seen['answer'])}")
        if os.environ.get("CHAT_PATH_VERBOSE"):
            for phase in ("build", "answer"):
                for m, f in sorted(self.seen[phase]):
                    print(f"    {phase}: {m}.{f}")


CURRENT: list[Trace] = []  # the trace being taken (threads started earlier call `dispatch`)


def dispatch(frame: FrameType, event: str, arg: Any) -> None:
    if CURRENT:
        CURRENT[0](frame, event, arg)


def main() -> None:
    os.environ["PYTHONPATH"] = os.pathsep.join([str(FAKE), os.environ.get("PYTHONPATH", "")])
    sys.path.insert(0, str(FAKE))
    from litestar.testing import TestClient

    from localradix.config import ServerArgs
    from localradix.server.app import create_app

    path, handler, body = DIALECTS[sys.argv[1] if len(sys.argv) > 1 else "openai"]
    from fake_engine_core import fake_tokenizer

    args = ServerArgs(default_max_tokens=16)
    core = "fake_engine_core:FakeCore"
    app = create_app(args, core_factory=core, tokenizer_factory=fake_tokenizer)
    threading.setprofile(dispatch)  # the app runs in the test client's own thread
    sys.setprofile(dispatch)
    with TestClient(app, base_url=f"http://127.0.0.1:{args.port}") as client:
        client.post(path, json={**body, "stream": False})  # warm: imports, first-call paths
        for title, stream in (("non-streaming", False), ("streaming", True)):
            trace = Trace(handler)
            CURRENT.append(trace)
            try:
                r = client.post(path, json={**body, "stream": stream})
            finally:
                CURRENT.clear()
            assert r.status_code == 200, r.text
            trace.report(title)


if __name__ == "__main__":
    main()
