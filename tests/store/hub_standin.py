"""A local stand-in for the Hugging Face hub's file API, enough for huggingface-hub's
`model_info` and `snapshot_download` (read in huggingface_hub 2.4's hf_api.py,
_snapshot_download.py and file_download.py). Routes served:

- `GET /api/models/{org}/{name}/revision/{rev}`: repo info, `sha` and `siblings`
  (`rfilename`, `size`); `model_info(..., files_metadata=True)` and `snapshot_download`.
- `GET /api/models/{org}/{name}/tree/{rev}`: the file list (`type`, `path`, `size`, `oid`),
  unpaginated (`list_repo_tree(recursive=True)` inside `snapshot_download`).
- `HEAD /{org}/{name}/resolve/{rev}/{path}`: the file's metadata, in `X-Repo-Commit`, `ETag`
  (the content's sha256, which names the blob) and `Content-Length`.
- `GET /{org}/{name}/resolve/{rev}/{path}`: the bytes; `Range: bytes=N-` answers 206 with
  `Content-Range` (how the hub client resumes a cut connection).
- Errors as the hub sends them: 404 with `X-Error-Code: RepoNotFound`, `RevisionNotFound` or
  `EntryNotFound`.

`cut[path] = n` makes the next full GET of `path` send its headers and n bytes, then drop the
connection; with `die_on_cut` it first waits until the repo's other files were served (so the
test does not race the client's parallel downloads), then drops every connection unanswered, as
a hub gone mid-file would (`stop()` closes its port).
Every request is logged as (method, path, Range header).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

SHA = "0123456789abcdef0123456789abcdef01234567"  # every repo's one commit


@dataclass
class Repo:
    files: dict[str, Path]  # repo path -> local file with the bytes
    _etags: dict[str, str] = field(default_factory=dict)

    def etag(self, path: str) -> str:
        if path not in self._etags:
            self._etags[path] = hashlib.sha256(self.files[path].read_bytes()).hexdigest()
        return self._etags[path]


@dataclass
class HubStandIn:
    repos: Mapping[str, Repo]
    port: int = 0
    cut: dict[str, int] = field(default_factory=dict)
    die_on_cut: bool = False
    dead: bool = False
    served: set[str] = field(default_factory=set)  # files sent whole
    log: list[tuple[str, str, str | None]] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> HubStandIn:
        handler = type("Handler", (_Handler,), {"hub": self})
        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            server.shutdown()
            server.server_close()

    def gets(self, path: str) -> list[str | None]:
        """The Range headers of the GETs of one file, in order (None: the whole file)."""
        return [r for m, p, r in self.log if m == "GET" and p.endswith("/" + path)]


class _Handler(BaseHTTPRequestHandler):
    hub: HubStandIn
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)

    def _answer(self, head: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        if self.hub.dead:
            self.close_connection = True
            return
        self.hub.log.append((self.command, path, self.headers.get("Range")))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 6:
            self._api("/".join(parts[2:4]), parts[4], parts[5])
        elif len(parts) >= 5 and parts[2] == "resolve":
            self._file("/".join(parts[:2]), parts[3], "/".join(parts[4:]), head)
        else:
            self._error(404, "RepoNotFound")

    def _api(self, repo_id: str, route: str, revision: str) -> None:
        repo = self._repo(repo_id, revision)
        if repo is None:
            return
        if route == "revision":
            siblings = [{"rfilename": p, "size": f.stat().st_size} for p, f in repo.files.items()]
            self._json({"id": repo_id, "sha": SHA, "siblings": siblings})
        else:
            tree = [
                {"type": "file", "path": p, "size": f.stat().st_size, "oid": repo.etag(p)[:40]}
                for p, f in repo.files.items()
            ]
            self._json(tree)

    def _file(self, repo_id: str, revision: str, path: str, head: bool) -> None:
        repo = self._repo(repo_id, revision)
        if repo is None:
            return
        if path not in repo.files:
            self._error(404, "EntryNotFound")
            return
        data = repo.files[path].read_bytes()
        start = _range_start(self.headers.get("Range"))
        self.send_response(206 if start else 200)
        self.send_header("X-Repo-Commit", SHA)
        self.send_header("ETag", f'"{repo.etag(path)}"')
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(data) - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if head:
            return
        cut = self.hub.cut.pop(path, None) if not start else None
        if cut is not None and self.hub.die_on_cut:
            self._wait_served(set(repo.files) - {path})
        self.wfile.write(data[start : cut if cut is not None else len(data)])
        if cut is None:
            self.hub.served.add(path)
        else:
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            self.hub.dead = self.hub.die_on_cut

    def _wait_served(self, paths: set[str], timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not paths <= self.hub.served and time.monotonic() < deadline:
            time.sleep(0.02)

    def _repo(self, repo_id: str, revision: str) -> Repo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound")
        elif revision not in ("main", SHA):
            self._error(404, "RevisionNotFound")
        return repo if repo is not None and revision in ("main", SHA) else None

    def _json(self, value: Any) -> None:
        body = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str) -> None:
        body = json.dumps({"error": code}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Repo-Commit", SHA)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def _range_start(header: str | None) -> int:
    if not header or not header.startswith("bytes="):
        return 0
    return int(header[len("bytes=") :].split("-", 1)[0] or 0)
