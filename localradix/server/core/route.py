"""The one way a generating route runs: read the body once, decode it once into the dialect's
Struct, resolve its model once, let the dialect build the job (its adapter, then `chat_job` or
`completion_job`), then answer: streamed or gathered, framed by the dialect's renderers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from litestar import Request, Response

from localradix.server.core.body import decode
from localradix.server.core.gather import Gathered, answer
from localradix.server.core.http import SSE, state
from localradix.server.errors import APIError
from localradix.server.tokenizer_manager import Job, TokenizerManager


class Body(Protocol):
    """What the runner reads of any dialect's body: the model it names (None: the default)."""

    @property
    def model(self) -> str | None: ...


B = TypeVar("B", bound=Body)


@dataclass(frozen=True)
class Rendered:
    """A submitted job and how its dialect frames the answer: `stream` (None: gathered whole
    and rendered by `whole`)."""

    job: Job
    stream: Callable[[], AsyncIterator[bytes]] | None
    whole: Callable[[Gathered], Any]
    media_type: str = SSE


Build = Callable[[Request[Any, Any, Any], TokenizerManager, B], Awaitable[Rendered | Response[Any]]]


async def run_route(
    request: Request[Any, Any, Any],
    body_type: type[B],
    build: Build[B],
    empty: bytes = b"",
    reworded: Callable[[APIError, B], APIError] | None = None,
) -> Response[Any]:
    """The route's answer; `empty`: what an empty body reads as; `reworded`: the dialect's
    word for an error the core raised (by its code), or None."""
    body = decode(await request.body() or empty, body_type)
    keep_alive = getattr(body, "keep_alive", None)
    manager = await state(request).manager_for(request, body.model, keep_alive)
    try:
        built = await build(request, manager, body)
        if isinstance(built, Response):
            return built
        return await answer(request, built.job, built.stream, built.whole, built.media_type)
    except APIError as exc:
        if reworded is None:
            raise
        raise reworded(exc, body) from None
