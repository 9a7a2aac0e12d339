"""A client that hangs up while sending its body is neither an error of the server's nor a
traceback: the request is counted as 499 (nginx's "client closed request"), never as a 500, and
the server keeps answering."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlparse

import httpx
from server_harness import wait_until


def _hang_up_mid_upload(base: str) -> None:
    url = urlparse(base)
    with socket.create_connection((url.hostname, url.port)) as sock:
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\n"
            f"Host: {url.hostname}:{url.port}\r\n"
            "Content-Type: application/json\r\n"
            "Content-Length: 100000\r\n\r\n"
        )
        sock.sendall(head.encode() + b'{"messages": [{"role": "user", "content": "' + b"x" * 5000)
        time.sleep(0.3)  # the server is reading the body now


def _errors(base: str) -> dict[str, float]:
    text = httpx.get(base.removesuffix("/v1") + "/metrics").text
    out = {}
    for line in text.splitlines():
        if line.startswith("localradix_http_errors_total{"):
            labels, value = line.rsplit(" ", 1)
            out[labels.split('status="')[1].split('"')[0]] = float(value)
    return out


def test_a_client_leaving_mid_upload_is_a_499_not_a_500(fake_server):
    before = _errors(fake_server.base)
    for _ in range(3):
        _hang_up_mid_upload(fake_server.base)
    assert wait_until(lambda: _errors(fake_server.base).get("499", 0) >= before.get("499", 0) + 3)
    after = _errors(fake_server.base)
    assert after.get("500", 0) == before.get("500", 0), after
    assert "Traceback" not in fake_server.log() and "client disconnected" in fake_server.log()
    assert httpx.get(fake_server.url + "/health").status_code == 200
