"""Security defaults, end to end: `localradix serve` on the bundled model, driven over HTTP as a
browser page or a client would. The attacks of issue 14: a cross-origin text/plain POST that
needs no CORS preflight, DNS rebinding (a foreign Host header on a loopback server), the API key
in `ps`, routes that answered without the key, prompt text in the stats feed."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import pytest
from server_harness import start_server

from localradix.config import ServerArgs
from localradix.server.security import AccessPolicy, is_loopback

pytestmark = pytest.mark.slow

KEY = "test-key-7f3a"
APP = "http://app.example"
ARGS = ["--backend", "cpu", "--max-total-tokens", "8192", "--max-running-requests", "8"]
CHAT = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The key from a file; one extra Host name and one web origin allowed."""
    key_file = tmp_path_factory.mktemp("key") / "key.txt"
    key_file.write_text(KEY + "\n")
    env = {k: v for k, v in os.environ.items() if k != "LOCALRADIX_API_KEY"}
    args = [*ARGS, "--api-key-file", str(key_file), "--allowed-hosts", "box.lan"]
    s = start_server([*args, "--cors-origins", APP], fake=False, env=env)
    yield s
    assert s.stop() == 0, s.log()[-3000:]


def auth(**headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}", **headers}


def assert_error(r: httpx.Response, status: int, code: str | None = None) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if code is not None:
        assert error["code"] == code, error
    return error


ROUTES = [
    ("GET", "/v1/models", ()),
    ("GET", "/v1/models/anything", ()),
    ("POST", "/v1/chat/completions", CHAT),
    ("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2}),
    ("GET", "/v1/stats", ()),
    ("GET", "/v1/stats/stream", ()),
    ("POST", "/v1/cache/flush", ()),
    ("POST", "/flush_cache", ()),
    ("GET", "/v1/loads", ()),
    ("GET", "/metrics", ()),
    ("GET", "/schema/openapi.json", ()),
    ("GET", "/schema/swagger", ()),
]


@pytest.mark.parametrize("method,path,body", ROUTES)
def test_every_route_but_health_needs_the_key(server, method, path, body):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = httpx.request(method, server.url + path, json=body, headers=headers, timeout=30)
        assert_error(r, 401, "invalid_api_key")
    assert httpx.get(server.url + "/health").status_code == 200


def test_with_the_key_the_routes_answer(server):
    with httpx.Client(base_url=server.url, headers=auth(), timeout=120) as c:
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert c.get("/metrics").text.startswith("# HELP")
        assert c.get("/schema/openapi.json").json()["info"]["title"] == "localradix"
        with c.stream("GET", "/v1/stats/stream") as r:
            first = next(line for line in r.iter_lines() if line.startswith("data: "))
        assert json.loads(first[6:])["engine_alive"] is True
        assert c.post("/v1/cache/flush").json() == {"flushed": True}


def test_anthropic_clients_send_the_key_as_x_api_key(server):
    assert httpx.get(server.url + "/v1/models", headers={"x-api-key": KEY}).status_code == 200
    assert_error(httpx.get(server.url + "/v1/models", headers={"x-api-key": "wrong"}), 401)


def test_the_key_file_is_not_on_the_command_line(server):
    cmdline = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes().decode()
    assert KEY not in cmdline


def test_a_foreign_host_is_refused_dns_rebinding(server):
    port = server.url.rsplit(":", 1)[1]
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example", "box.lan.evil"):
        r = httpx.post(
            server.url + "/v1/chat/completions", json=CHAT, headers=auth(Host=host), timeout=30
        )
        error = assert_error(r, 421, "host_not_allowed")
        assert "--allowed-hosts" in error["message"]
    for host in (
        f"localhost:{port}",
        f"127.0.0.1:{port}",
        f"[::1]:{port}",
        "box.lan",
        "a.localhost",
    ):
        r = httpx.get(server.url + "/v1/models", headers=auth(Host=host), timeout=30)
        assert r.status_code == 200, (host, r.text)
    r = httpx.get(server.url + "/health", headers={"Host": "evil.example"})
    assert_error(r, 421)


def test_a_foreign_origin_is_refused_and_cors_is_only_for_the_allowed_one(server):
    url = server.url + "/v1/chat/completions"
    for origin in ("http://evil.example", "null", "http://app.example.evil"):
        r = httpx.post(url, json=CHAT, headers=auth(Origin=origin), timeout=30)
        error = assert_error(r, 403, "origin_not_allowed")
        assert "--cors-origins" in error["message"]
        assert "access-control-allow-origin" not in r.headers
        pre = httpx.options(
            url, headers={"Origin": origin, "Access-Control-Request-Method": "POST"}, timeout=30
        )
        assert pre.status_code == 403 and "access-control-allow-origin" not in pre.headers
    pre = httpx.options(
        url,
        headers={
            "Origin": APP,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
        timeout=30,
    )
    assert pre.status_code in (200, 204) and pre.headers["access-control-allow-origin"] == APP
    r = httpx.post(url, json=CHAT, headers=auth(Origin=APP), timeout=120)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == APP
    # the page's own origin (a same-origin request) is not a cross-origin one
    r = httpx.get(server.url + "/v1/models", headers=auth(Origin=server.url), timeout=30)
    assert r.status_code == 200


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
)
def test_a_body_that_is_not_json_is_refused(server, content_type):
    """What a page can send cross-origin without a preflight; even with the key, 415."""
    for path, body in (
        ("/v1/chat/completions", CHAT),
        ("/v1/completions", {"prompt": "x", "max_tokens": 1}),
        ("/v1/cache/flush", {}),
    ):
        r = httpx.post(
            server.url + path,
            content=json.dumps(body),
            headers=auth(**{"Content-Type": content_type}),
            timeout=30,
        )
        error = assert_error(r, 415, "unsupported_media_type")
        assert "application/json" in error["message"]
    r = httpx.post(
        server.url + "/v1/chat/completions",
        content=json.dumps(CHAT),
        headers=auth(**{"Content-Type": "application/json; charset=utf-8"}),
        timeout=120,
    )
    assert r.status_code == 200, r.text


def test_the_measured_csrf_is_refused(server):
    """Issue 14 measured both answering 200: a page's text/plain POST to the cache flush."""
    headers = {"Origin": "http://evil.example", "Content-Type": "text/plain"}
    r = httpx.post(server.url + "/v1/cache/flush", content="{}", headers=headers)
    assert r.status_code in (401, 403), r.text
    r = httpx.post(server.url + "/v1/cache/flush", content="{}", headers=auth(**headers))
    assert_error(r, 403)


def test_authenticated_clients_see_prompt_previews(server):
    prompt = "Previews are shown to authenticated clients. " * 4
    body = {"prompt": prompt, "max_tokens": 1}
    for _ in range(2):  # the second one hits the cache: a prefix with a preview
        r = httpx.post(server.base + "/completions", json=body, headers=auth(), timeout=120)
        assert r.status_code == 200
    for _ in range(40):  # the engine refreshes its prefix table about once a second
        stats = httpx.get(server.base + "/stats", headers=auth(), timeout=30).json()
        previews = [row.get("preview", "") for row in stats["engine"]["top_prefixes"]]
        if any("Previews are shown" in p for p in previews):
            break
        httpx.post(server.base + "/completions", json=body, headers=auth(), timeout=120)
    assert any("Previews are shown" in p for p in previews), stats["engine"]["top_prefixes"]


def test_key_from_the_environment_and_no_prompt_previews():
    env = {"LOCALRADIX_API_KEY": KEY}
    s = start_server([*ARGS, "--no-prompt-previews"], fake=False, env=env)
    try:
        assert_error(httpx.get(s.base + "/models"), 401)
        body = {"prompt": "Never shown in the feed. " * 4, "max_tokens": 1}
        for _ in range(3):
            r = httpx.post(s.base + "/completions", json=body, headers=auth(), timeout=120)
            assert r.status_code == 200, r.text
        for _ in range(40):  # the engine refreshes its prefix table about once a second
            stats = httpx.get(s.base + "/stats", headers=auth(), timeout=30).json()["engine"]
            if stats["top_prefixes"]:
                break
            time.sleep(0.25)
        assert stats["top_prefixes"] and stats["recent_misses"] is not None
        text = json.dumps(stats)
        assert "Never shown" not in text and '"preview"' not in text and '"head"' not in text
        assert KEY not in Path(f"/proc/{s.proc.pid}/cmdline").read_bytes().decode()
    finally:
        assert s.stop() == 0, s.log()[-3000:]


def test_previews_only_for_loopback_or_authenticated_clients():
    def scope(client: str, auth_header: str | None = None) -> dict:
        headers = [(b"authorization", auth_header.encode())] if auth_header else []
        return {"client": (client, 5000), "headers": headers}

    open_lan = AccessPolicy.from_args(ServerArgs(host="0.0.0.0"), ())
    assert open_lan.shows_previews(scope("127.0.0.1"))
    assert open_lan.shows_previews(scope("::1"))
    assert not open_lan.shows_previews(scope("192.168.1.20"))
    keyed = AccessPolicy.from_args(ServerArgs(host="0.0.0.0"), (KEY,))
    assert keyed.shows_previews(scope("192.168.1.20", f"Bearer {KEY}"))
    assert not keyed.shows_previews(scope("127.0.0.1", "Bearer nope"))
    off = AccessPolicy.from_args(ServerArgs(no_prompt_previews=True), ())
    assert not off.shows_previews(scope("127.0.0.1"))
    assert not open_lan.check_host  # a LAN bind does not check Host unless --allowed-hosts
    assert AccessPolicy.from_args(ServerArgs(host="0.0.0.0", allowed_hosts=("a",)), ()).check_host
    assert all(
        map(is_loopback, ["localhost", "127.0.0.2", "::1", "::ffff:127.0.0.1", "x.localhost"])
    )
    assert not any(map(is_loopback, ["evil.example", "10.0.0.1", "localhost.evil", ""]))


def test_a_key_file_lists_one_key_per_line(tmp_path):
    from localradix.server.security import ApiKeyError, resolve_api_key, resolve_api_keys

    path = tmp_path / "keys"
    path.write_text("# the team's keys\n  alpha  \n\nbeta\nalpha\n")
    args = ServerArgs(api_key_file=str(path))
    assert resolve_api_keys(args) == ("alpha", "beta")
    assert resolve_api_key(args) == "alpha"  # what a client (the TUI) sends
    assert resolve_api_keys(ServerArgs(api_key="solo"), {}) == ("solo",)
    assert resolve_api_keys(ServerArgs(), {"LOCALRADIX_API_KEY": "env"}) == ("env",)
    assert resolve_api_keys(ServerArgs(), {}) == ()
    path.write_text("# nothing but a comment\n\n")
    with pytest.raises(ApiKeyError, match="holds no key"):
        resolve_api_keys(args)
    policy = AccessPolicy.from_args(ServerArgs(), ("alpha", "beta"))
    alpha, beta = (policy.caller({"authorization": f"Bearer {k}"}) for k in ("alpha", "beta"))
    assert alpha and beta and alpha != beta and "alpha" not in alpha
    assert policy.caller({"x-api-key": "beta"}) == beta
    assert policy.caller({"authorization": "Bearer gamma"}) is None
