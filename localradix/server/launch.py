"""`localradix serve [MODEL]`: the API process (uvicorn + Litestar) and its engine process.

Exit status: 0 after a clean shutdown (SIGINT/SIGTERM: in-flight requests drain for up to
DRAIN_TIMEOUT_S, then are aborted); 1 if the model fails to load or the engine process dies.
Only argparse and the config are imported at module level, so `--help` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

from localradix.config import ServerArgs, add_server_args, args_from_namespace

DRAIN_TIMEOUT_S = 5.0
# Test hooks: swap the engine core and tokenizer for doubles ("module:attr").
CORE_ENV = "LOCALRADIX_ENGINE_CORE"
TOKENIZER_ENV = "LOCALRADIX_TOKENIZER"
HTTP_ENV = "LOCALRADIX_UVICORN_HTTP"  # "h11" / "httptools" (default: uvicorn's choice)


def add_serve_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="start the OpenAI-compatible server",
        description="Serve a model over an OpenAI-compatible HTTP API.",
    )
    p.add_argument(
        "model",
        nargs="?",
        default=None,
        help="GGUF file or Hugging Face folder (default: the bundled SmolLM2-135M-Instruct)",
    )
    add_server_args(p, skip=("model",))


def run_serve(ns: argparse.Namespace) -> int:
    return serve(args_from_namespace(ns))


def serve(args: ServerArgs) -> int:
    import uvicorn

    class _Server(uvicorn.Server):
        """uvicorn re-raises SIGINT/SIGTERM after its graceful shutdown; after ours, exit 0."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            signals = (signal.SIGINT, signal.SIGTERM)
            original = {sig: signal.signal(sig, self.handle_exit) for sig in signals}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

    from localradix.server.app import create_app, default_tokenizer
    from localradix.server.engine_process import DEFAULT_CORE, load_factory

    core = os.environ.get(CORE_ENV, DEFAULT_CORE)
    tokenizer = load_factory(os.environ[TOKENIZER_ENV]) if TOKENIZER_ENV in os.environ else None
    app = create_app(args, core_factory=core, tokenizer_factory=tokenizer or default_tokenizer)
    state = app.state.server
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_config=None,
        access_log=args.log_level == "debug",
        timeout_graceful_shutdown=int(DRAIN_TIMEOUT_S),
        limit_concurrency=None,
        http=os.environ.get(HTTP_ENV, "auto"),
    )
    server = _Server(config)
    state.request_exit = lambda: setattr(server, "should_exit", True)
    state.is_exiting = lambda: server.should_exit
    try:
        server.run()
    except SystemExit:  # uvicorn exits this way when the app's startup failed
        pass
    finally:
        state.client.close_sync()
    if state.startup_error:
        print(f"localradix: error: {state.startup_error}", flush=True)
    return state.exit_code or (0 if server.started else 1)
