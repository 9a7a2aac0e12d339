"""Ollama's `/api/pull` and `DELETE /api/delete` over the model store (`localradix/store/`).

A pull downloads from the Hugging Face hub (`ORG/NAME[:QUANT]`, as the CLI's pull takes it)
in a thread; streamed, it reports Ollama's progress lines: "pulling manifest", then the bytes
written into the hub cache against the planned size, then "success" (or an `error` line). A
delete refuses the bundled model and a model that is loaded and busy; an idle loaded one is
unloaded first. `/api/push`, `/api/create` and `/api/copy` stay 501: the store only mirrors the
hub.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
from litestar import Request, Response, delete, post

from localradix.server.core.body import decode
from localradix.server.core.docs import OllamaError, errors
from localradix.server.core.http import NDJSON, ClosingStream, encode_json, json_response, state
from localradix.server.errors import APIError, bad_request

PROGRESS_EVERY_S = 0.5


class PullBody(msgspec.Struct, kw_only=True):
    model: str = ""
    name: str = ""  # the older clients' spelling
    stream: bool = True
    insecure: bool = False  # Ollama's registry flag; nothing to relax for the hub


class DeleteBody(msgspec.Struct, kw_only=True):
    model: str = ""
    name: str = ""


@post(
    "/pull",
    summary="Ollama: pull a model from the Hugging Face hub",
    status_code=200,
    responses=errors(OllamaError, (400, 401, 413, 503)),
)
async def pull_model(request: Request[Any, Any, Any]) -> Response[Any]:
    body = decode(await request.body() or b"{}", PullBody)
    ref = _ref(body.model or body.name)
    pulling = _Pull(ref)
    if not body.stream:
        await pulling.task
        return json_response({"status": "success"})
    return ClosingStream(pulling.lines(), NDJSON)


@delete(
    "/delete",
    summary="Ollama: delete a model from the store",
    status_code=200,
    responses=errors(OllamaError, (400, 401, 404, 409, 413)),
)
async def delete_model(request: Request[Any, Any, Any]) -> Response[Any]:
    from localradix.server.model_list import model_key
    from localradix.store.remove import remove_model

    body = decode(await request.body() or b"{}", DeleteBody)
    entry = await asyncio.to_thread(_entry, body.model or body.name)
    if not await state(request).pool.unload_idle(model_key(entry.path)):
        raise APIError(409, f"'{entry.ref}' is serving requests (or is the default model)")
    await asyncio.to_thread(remove_model, entry)
    return Response(b"", status_code=200)


@post(["/push", "/create", "/copy"], status_code=200, include_in_schema=False)
async def not_in_store(request: Request[Any, Any, Any]) -> Response[Any]:
    raise APIError(
        501,
        "the model store mirrors the Hugging Face hub: pull models with /api/pull or "
        "`localradix pull ORG/NAME:QUANT`; pushing, creating and copying are not supported",
    )


class _Pull:
    """One pull running in a thread, and what it has written so far."""

    def __init__(self, ref: str) -> None:
        from localradix.store.catalog import repo_dir
        from localradix.store.names import split_ref

        self.ref = ref
        self.blobs = repo_dir(split_ref(ref)[0]) / "blobs"
        self.start = _bytes_in(self.blobs)
        self.total: int | None = None
        self.task = asyncio.ensure_future(asyncio.to_thread(self._run))

    def _run(self) -> None:
        from localradix.store import StoreError
        from localradix.store.hub import HubUnreachable
        from localradix.store.pull import pull

        try:
            pull(self.ref, on_plan=lambda plan: setattr(self, "total", plan.size or 0))
        except HubUnreachable as exc:
            raise APIError(503, str(exc)) from None
        except StoreError as exc:
            raise bad_request(str(exc), "model") from None

    async def lines(self) -> AsyncIterator[bytes]:
        yield _line({"status": "pulling manifest"})
        try:
            while not self.task.done():
                await asyncio.wait([self.task], timeout=PROGRESS_EVERY_S)
                if self.total is not None:
                    yield _line(self._progress())
            self.task.result()
        except APIError as err:
            yield _line({"error": err.message})
            return
        yield _line({"status": "success"})

    def _progress(self) -> dict[str, Any]:
        done = max(0, _bytes_in(self.blobs) - self.start)
        total = self.total or 0
        return {
            "status": f"pulling {self.ref}",
            "digest": self.ref,
            "total": total,
            "completed": min(done, total) if total else done,
        }


def _ref(name: str) -> str:
    from localradix.store.names import is_repo_id, split_ref

    if not name:
        raise bad_request("give the model to pull as ORG/NAME[:QUANT]", "model")
    if not is_repo_id(split_ref(name)[0]):
        raise bad_request(
            f"{name!r} is not a Hugging Face repo id: pull ORG/NAME[:QUANT], e.g. "
            "bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M",
            "model",
        )
    return name


def _entry(name: str) -> Any:
    from localradix.store import StoreError
    from localradix.store.lookup import find_entry

    try:
        entry = find_entry(name) if name else None
    except StoreError as exc:
        raise bad_request(str(exc), "model") from None
    if entry is None:
        raise APIError(404, f"model '{name}' not found: /api/tags lists the store's models")
    if entry.repo is None:
        raise bad_request("the bundled model is always kept: there is nothing to delete", "model")
    return entry


def _bytes_in(folder: Path) -> int:
    """Bytes in the hub cache's blob folder (finished blobs and `.incomplete` ones)."""
    try:
        return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    except OSError:
        return 0


def _line(payload: dict[str, Any]) -> bytes:
    return encode_json(payload) + b"\n"


ROUTES = [pull_model, delete_model, not_in_store]
