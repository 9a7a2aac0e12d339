"""Bare `localradix` when its port is busy: the dashboard's server goes to a free port, says so,
and the dashboard shows the address actually served; a --port that is taken is refused. The
server is the real `localradix serve` on the fake engine core (tests/server), so it is up in
a second or two."""

from __future__ import annotations

import argparse
import logging
import os
import socket
from pathlib import Path

import pytest
from tui_fakes import screen_text

from localradix import child_server
from localradix.tui import main

SERVER_TESTS = Path(__file__).resolve().parents[1] / "server"


@pytest.fixture
def busy_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.fixture
def fake_engine(monkeypatch):
    """The launched server uses the fake engine core and tokenizer."""
    monkeypatch.setenv("LOCALRADIX_ENGINE_CORE", "fake_engine_core:FakeCore")
    monkeypatch.setenv("LOCALRADIX_TOKENIZER", "fake_engine_core:fake_tokenizer")
    path = os.pathsep.join(filter(None, [str(SERVER_TESTS), os.environ.get("PYTHONPATH")]))
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.delenv("LOCALRADIX_API_KEY", raising=False)


@pytest.mark.asyncio
async def test_a_busy_default_port_moves_the_server_and_the_dashboard_shows_it(
    busy_port, fake_engine, monkeypatch, caplog
):
    monkeypatch.setattr(main, "DEFAULT_PORT", busy_port)
    caplog.set_level(logging.WARNING, logger="localradix.tui")
    server = main.start_server(argparse.Namespace(model=None, port=None))
    try:
        served = int(server.url.rsplit(":", 1)[1])
        assert served != busy_port
        assert server.notice == (
            f"port {busy_port} is busy (another server?), so serving on port {served}"
        )
        assert server.notice in caplog.text
        assert Path(server.log_path).name.startswith("localradix-server-")
        app = main.make_app(server.url, None, server=server)
        async with app.run_test(size=(100, 30)) as pilot:
            for _ in range(600):  # the fake engine is up in a second or two
                if app.connected or server.poll() is not None:
                    break
                await pilot.pause(0.1)
            assert app.connected, server.process.log_tail()
            await pilot.pause(0.3)
            header = screen_text(app).splitlines()[0]
        assert f"127.0.0.1:{served}" in header and "● live" in header, header
    finally:
        server.stop()


def test_a_free_default_port_is_used_as_is(monkeypatch):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setattr(main, "DEFAULT_PORT", port)
    assert main.choose_port(None) == (port, None)


def test_a_busy_port_given_with_port_is_refused(busy_port, capsys):
    ns = argparse.Namespace(model=None, port=busy_port)
    assert main.serve_and_attach(ns) == 1
    err = capsys.readouterr().err
    assert f"port {busy_port} on 127.0.0.1 is already in use" in err
    assert "leave out --port" in err


def test_the_api_key_goes_to_the_server_by_environment_not_argv(tmp_path, monkeypatch):
    monkeypatch.delenv("LOCALRADIX_API_KEY", raising=False)
    key_file = tmp_path / "key"
    key_file.write_text("from-a-file\n")
    ns = argparse.Namespace(model=None, port=None, api_key=None, api_key_file=str(key_file))
    argv = child_server.serve_argv(ns, 8123)
    assert "--api-key-file" not in argv and "--api-key" not in argv
    assert main.server_api_key(ns) == "from-a-file"
    monkeypatch.setenv("LOCALRADIX_API_KEY", "from-env")
    assert main.server_api_key(argparse.Namespace(api_key=None, api_key_file=None)) == "from-env"
