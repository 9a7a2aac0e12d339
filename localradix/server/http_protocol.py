"""The HTTP connection layer under the app: uvicorn's h11 protocol with deadlines and a cap.

uvicorn closes a kept-alive connection only after a response; a socket that connects and
sends nothing, or sends a request one byte at a time (slowloris), stays open for ever, and a
few hundred of them exhaust a desktop's 1,024 file descriptors. Here:

- the headers of each request must arrive within `header_timeout` of the connection (or of the
  previous response), and its body within `body_timeout` of its headers; otherwise the
  connection is closed (with a JSON 408 when nothing was answered yet);
- beyond `max_connections` open connections a new one gets a JSON 503 and is closed at once;
- malformed HTTP gets a JSON 400 in OpenAI's error shape instead of uvicorn's plain text;
- accept() failing for want of descriptors is logged once per interval, never as a flood of
  tracebacks (`quiet_fd_exhaustion`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger("localradix.server")

FD_LOG_INTERVAL_S = 10.0
FD_ERRORS = ("out of system resource", "Too many open files")


def _json_error(status: int, message: str, code: str) -> bytes:
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return json.dumps(body).encode()


class GuardedH11Protocol(H11Protocol):
    """Set the limits with `configure` before uvicorn creates connections."""

    header_timeout: float = 30.0
    body_timeout: float = 120.0
    max_connections: int = 1000

    @classmethod
    def configure(cls, header_timeout: float, body_timeout: float, max_connections: int) -> type:
        return type(
            cls.__name__,
            (cls,),
            dict(
                header_timeout=header_timeout,
                body_timeout=body_timeout,
                max_connections=max_connections,
            ),
        )

    # ---- connection life -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._phase = ""  # "headers" | "body" while a deadline runs
        if len(self.connections) > self.max_connections:
            logger.warning(
                "refused a connection: %d open (--max-connections)", self.max_connections
            )
            message = "the server has too many open connections; retry shortly"
            self._answer(503, message, "too_many_connections", retry_after=True)
            return
        self._arm(self.header_timeout, "headers")

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and self.conn.their_state is h11.IDLE:
            self._arm(self.header_timeout, "headers")  # a new request begins on a kept-alive link
        super().data_received(data)
        self._follow_request()

    def on_response_complete(self) -> None:
        self._disarm()  # between requests uvicorn's keep-alive timeout applies
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        self._answer(400, f"malformed HTTP request: {msg}", "malformed_http")

    # ---- deadlines ---------------------------------------------------------------------------

    def _follow_request(self) -> None:
        """Once a request's headers are in, its body has its own deadline; once it is all in,
        the app's answer takes as long as it takes."""
        if self._phase == "headers" and self.conn.their_state is h11.SEND_BODY:
            self._arm(self.body_timeout, "body")
        elif self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED):
            self._disarm()

    def _arm(self, seconds: float, phase: str) -> None:
        self._disarm()
        self._phase = phase
        self._deadline = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        deadline = getattr(self, "_deadline", None)
        if deadline is not None:
            deadline.cancel()
        self._deadline, self._phase = None, ""

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self._phase == "headers" and self.conn.trailing_data[0]:  # a request half-sent
            message = f"the request's headers did not arrive within {self.header_timeout:g} s"
            self._answer(408, message, "request_timeout")
        else:
            # An idle connection, or a body the app is waiting for (it sees a hang-up: 499).
            self.transport.close()

    def _answer(self, status: int, message: str, code: str, retry_after: bool = False) -> None:
        """A JSON error written straight to the socket, then the connection closed."""
        body = _json_error(status, message, code)
        reason = {400: b"Bad Request", 408: b"Request Timeout", 503: b"Service Unavailable"}
        head = [
            b"HTTP/1.1 %d %s" % (status, reason[status]),
            b"content-type: application/json",
            b"content-length: %d" % len(body),
            b"connection: close",
        ]
        if retry_after:
            head.append(b"retry-after: 1")
        self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        self.transport.close()


def quiet_fd_exhaustion(loop: asyncio.AbstractEventLoop) -> None:
    """Log accept() failures for want of descriptors once per interval, without a traceback
    (asyncio retries the accept itself); other loop errors go to the default handler."""
    last = [0.0]
    suppressed = [0]

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        text = f"{context.get('message', '')} {context.get('exception', '')}"
        if not any(marker in text for marker in FD_ERRORS):
            loop.default_exception_handler(context)
            return
        now = time.monotonic()
        if now - last[0] < FD_LOG_INTERVAL_S:
            suppressed[0] += 1
            return
        logger.error(
            "out of file descriptors: new connections wait (%d more such errors since the last "
            "report); raise the limit (ulimit -n) or lower --max-connections",
            suppressed[0],
        )
        last[0], suppressed[0] = now, 0

    loop.set_exception_handler(handle)
