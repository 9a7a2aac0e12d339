"""Sockets that never finish a request are closed, a flood of connections is refused fast, and
running out of descriptors neither floods the log nor takes the server down (fake engine)."""

from __future__ import annotations

import json
import resource
import socket
import time
from urllib.parse import urlparse

import httpx
import pytest
from server_harness import start_server, wait_until

pytestmark = pytest.mark.slow  # seconds of e2e work: the full suite runs it, the fast tier does not

TIMEOUTS = ["--http-header-timeout", "1", "--http-body-timeout", "1"]


@pytest.fixture(scope="module")
def guarded():
    server = start_server([*TIMEOUTS, "--max-connections", "40"], fake=True)
    yield server
    server.stop()


def _connect(server) -> socket.socket:
    url = urlparse(server.url)
    sock = socket.create_connection((url.hostname, url.port))
    sock.settimeout(10)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _json_body(raw: bytes) -> dict:
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"application/json" in head.lower(), raw
    return json.loads(body)


def test_an_idle_socket_is_closed_after_the_header_timeout(guarded):
    with _connect(guarded) as sock:
        start = time.monotonic()
        assert _read_all(sock) == b""  # closed without a word: it never asked anything
        assert 0.5 < time.monotonic() - start < 5


def test_slowloris_headers_get_a_json_408(guarded):
    with _connect(guarded) as sock:
        start = time.monotonic()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        for _ in range(3):
            time.sleep(0.3)
            sock.sendall(b"X-Slow: 1\r\n")
        raw = _read_all(sock)
        assert raw.startswith(b"HTTP/1.1 408") and time.monotonic() - start < 5
        assert _json_body(raw)["error"]["code"] == "request_timeout"


def test_a_body_that_stops_arriving_is_dropped(guarded):
    host = urlparse(guarded.url).netloc
    with _connect(guarded) as sock:
        head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
        head += "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        sock.sendall(head.encode() + b'{"messages": ')
        start = time.monotonic()
        assert _read_all(sock) == b""  # the app saw a hang-up (a 499), nothing is sent
        assert 0.5 < time.monotonic() - start < 5
    assert httpx.get(guarded.url + "/health").status_code == 200


def test_malformed_http_gets_a_json_400(guarded):
    with _connect(guarded) as sock:
        sock.sendall(b"THIS IS NOT HTTP\r\n\r\n")
        raw = _read_all(sock)
    assert raw.startswith(b"HTTP/1.1 400")
    assert _json_body(raw)["error"]["code"] == "malformed_http"


def test_connections_beyond_the_cap_get_a_fast_503(guarded):
    socks = [_connect(guarded) for _ in range(40)]
    try:
        time.sleep(0.2)
        with _connect(guarded) as extra:
            start = time.monotonic()
            raw = _read_all(extra)
            assert time.monotonic() - start < 1
        assert raw.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in raw.lower()
        assert _json_body(raw)["error"]["code"] == "too_many_connections"
    finally:
        for s in socks:
            s.close()
    assert wait_until(lambda: httpx.get(guarded.url + "/health").status_code == 200)


@pytest.mark.slow
def test_running_out_of_descriptors_logs_a_line_per_interval_and_recovers():
    server = start_server([*TIMEOUTS, "--max-connections", "5000"], fake=True)
    socks: list[socket.socket] = []
    try:
        resource.prlimit(server.proc.pid, resource.RLIMIT_NOFILE, (256, 256))
        for _ in range(400):  # more than the server can accept
            try:
                socks.append(_connect(server))
            except OSError:
                break
        time.sleep(4)  # the server's accept() fails all this while
        log = server.log()
        assert len(log.encode()) < 1_000_000, len(log)
        assert "out of file descriptors" in log and "Traceback" not in log
        for s in socks:
            s.close()
        socks.clear()
        time.sleep(1.5)  # the header timeout closes what was accepted
        assert wait_until(
            lambda: httpx.get(server.url + "/health", timeout=2).status_code == 200, timeout=15
        )
    finally:
        for s in socks:
            s.close()
        server.stop()
