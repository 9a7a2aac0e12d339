"""`localradix serve [MODEL]`: the API process (uvicorn + Litestar) and its engine process.

Exit status: 0 after a clean shutdown (SIGINT/SIGTERM: in-flight requests get up to
--drain-timeout seconds, then end with a 503 error; a second signal ends them at once); 1 if
the port is taken, the model fails to load or the engine process dies. Only argparse and the
config are imported at module level, so `--help` stays fast.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from localradix.child_server import port_in_use
from localradix.config import ServerArgs, add_server_args

logger = logging.getLogger("localradix.server")

MAX_DRAIN_TIMEOUT_S = 3600.0
FINAL_FLUSH_S = 5  # uvicorn's own grace, after our drain: the last bytes of ended responses
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


def check_serve_args(args: ServerArgs) -> str | None:
    """What makes these arguments unusable, in one line (checked before loading the model)."""
    from localradix.server.model_pool import check_pool_args
    from localradix.server.security import ApiKeyError, resolve_api_key

    if not 0 <= args.drain_timeout <= MAX_DRAIN_TIMEOUT_S:
        return f"--drain-timeout must be between 0 and {MAX_DRAIN_TIMEOUT_S:.0f} seconds"
    problem = check_pool_args(args)
    if problem:
        return problem
    if args.http_header_timeout <= 0 or args.http_body_timeout <= 0:
        return "--http-header-timeout and --http-body-timeout must be > 0 seconds"
    if args.max_connections is not None and args.max_connections < 1:
        return "--max-connections must be at least 1"
    if args.chat_template and not os.path.isfile(args.chat_template):
        return f"--chat-template {args.chat_template}: no such file (give a .jinja template file)"
    try:
        resolve_api_key(args)
    except ApiKeyError as exc:
        return str(exc)
    if port_in_use(args.host, args.port):
        return (
            f"port {args.port} on {args.host} is already in use (another localradix?); stop "
            "what listens there or pick a free port with --port"
        )
    return None


FD_RESERVE = 128  # descriptors kept for the model files, logs, the engine and its sockets


def connection_cap(args: ServerArgs) -> int:
    """--max-connections, or what the descriptor limit leaves after the reserve."""
    if args.max_connections is not None:
        return args.max_connections
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(16, soft - FD_RESERVE)


def _guarded_protocol(args: ServerArgs) -> type:
    from localradix.server.http_protocol import GuardedH11Protocol

    return GuardedH11Protocol.configure(
        args.http_header_timeout, args.http_body_timeout, connection_cap(args)
    )


def serve(args: ServerArgs) -> int:
    problem = check_serve_args(args)
    if problem:
        print(f"localradix: error: {problem}", file=sys.stderr, flush=True)
        return 1
    if args.api_key:
        print(
            "localradix: warning: --api-key is visible to other users in `ps`; prefer "
            "--api-key-file PATH or the LOCALRADIX_API_KEY environment variable",
            file=sys.stderr,
            flush=True,
        )
    import uvicorn

    class _Server(uvicorn.Server):
        """SIGINT/SIGTERM start our drain (app.py) rather than uvicorn's immediate shutdown,
        and are not re-raised afterwards: a clean shutdown exits 0."""

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if self.should_exit or not state.request_shutdown():
                super().handle_exit(sig, frame)

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
        timeout_graceful_shutdown=FINAL_FLUSH_S,
        limit_concurrency=None,
        http=os.environ.get(HTTP_ENV) or _guarded_protocol(args),
    )
    server = _Server(config)
    state.request_exit = lambda: setattr(server, "should_exit", True)
    state.is_exiting = lambda: server.should_exit
    try:
        server.run()
    except SystemExit:  # uvicorn exits this way when the app's startup failed
        pass
    finally:
        state.close_sync()
    if state.startup_error:
        print(f"localradix: error: {state.startup_error}", flush=True)
    return state.exit_code or (0 if server.started else 1)
