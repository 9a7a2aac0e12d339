"""The engine process: an EngineCore built and driven by the engine loop, over ZMQ sockets
to the API process (wire format in `engine/transport.py`, messages in `messages.py`).

The loop runs on a worker thread, not the main thread: stepping torch from the main thread
measured ~4x the CPU time per token on a small busy CPU (intra-op threads spinning at
barriers); a worker thread matches `localradix.Engine`. The main thread only waits, so SIGTERM
is still handled promptly.
"""

from __future__ import annotations

import importlib
import logging
import signal
import sys
import threading
from typing import Any

import zmq

from localradix.config import ServerArgs
from localradix.engine.loop import run_engine
from localradix.engine.transport import ZmqTransport
from localradix.messages import Shutdown

__all__ = ["DEFAULT_CORE", "Shutdown", "engine_main", "load_factory"]

DEFAULT_CORE = "localradix.engine.core:EngineCore"


def load_factory(path: str) -> Any:
    """`"package.module:attr"` -> the attribute (the EngineCore class, or a test double)."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def engine_main(
    args: ServerArgs, req_addr: str, out_addr: str, core_factory: str, parent_pid: int
) -> None:
    """Entry point of the engine process (multiprocessing target; exit code 1 on failure)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the API process, which drains
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s [engine] %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.connect(req_addr)
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 0)
    push.setsockopt(zmq.LINGER, 2000)
    push.connect(out_addr)
    transport = ZmqTransport(pull, push, parent_pid)
    signal.signal(signal.SIGTERM, lambda *_: transport.terminate())
    ok: list[bool] = []
    worker = threading.Thread(
        target=lambda: ok.append(run_engine(lambda: load_factory(core_factory)(args), transport)),
        name="localradix-engine-loop",
        daemon=True,
    )
    worker.start()
    while worker.is_alive():
        worker.join(0.5)
    for sock in (pull, push):
        sock.close()
    ctx.term()
    if not (ok and ok[0]):
        sys.exit(1)
