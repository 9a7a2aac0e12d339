"""`POST /tokenize` and `POST /detokenize` in llama-server's shape, also taking vLLM's fields.

/tokenize takes `content` (llama-server: no special tokens unless `add_special`), `prompt`
(vLLM: BOS by the model's rule unless `add_special_tokens` is false) or chat `messages`
(exactly the ids the chat route would feed the model); `with_pieces` pairs each id with its
text, or with its bytes where they are not UTF-8 on their own (llama-server's shape).
/detokenize turns ids back into text, special tokens spelled out. Both sit at the bare paths,
where llama-server and vLLM serve them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Annotated, Any, TypeVar

import msgspec
from litestar import Request, Response, post
from litestar.openapi import ResponseSpec
from msgspec import Meta, Struct

from localradix.server.core.body import decode
from localradix.server.core.chat_request import ChatRequest
from localradix.server.core.chat_template import chat_text, template_messages, template_vars
from localradix.server.core.docs import ERRORS
from localradix.server.core.http import json_response, state
from localradix.server.core.jobs import LONG_TEXT_CHARS, encode, encode_prompt
from localradix.server.core.served import openai_not_found, served_model
from localradix.server.errors import bad_request
from localradix.server.protocol import ChatMessage, Count, Tool
from localradix.server.tokenizer_manager import TokenizerManager

LONG_TOKENS = LONG_TEXT_CHARS // 4  # more ids than this are turned to text in a thread
MAX_TOKENS = 1 << 20  # ids per /detokenize (the body limit caps them near here anyway)
T = TypeVar("T")


class TokenizeBody(Struct, kw_only=True):
    """Exactly one of `content`, `prompt` or `messages`."""

    content: str | None = None  # llama-server's field
    prompt: str | None = None  # vLLM's field
    messages: Annotated[list[ChatMessage], Meta(min_length=1)] | None = None
    # With `messages`, as on /v1/chat/completions:
    tools: list[Tool] | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    # BOS (and EOS) by the model's rule; default: no for `content`, yes for `prompt`.
    add_special: bool | None = None
    add_special_tokens: bool | None = None  # vLLM's name for the same
    with_pieces: bool = False
    model: str | None = None  # None: the served model


class DetokenizeBody(Struct, kw_only=True):
    tokens: Annotated[list[Count], Meta(max_length=MAX_TOKENS)]
    model: str | None = None


class Piece(Struct):
    id: int
    piece: str | list[int]  # the text, or the bytes when they are not UTF-8 on their own


class TokenizeResponse(Struct):
    tokens: list[int | Piece]
    count: int
    max_model_len: int


class DetokenizeResponse(Struct):
    content: str
    prompt: str  # vLLM's name for the same text


@post(
    "/tokenize",
    summary="llama-server / vLLM: text or chat messages as the model's token ids",
    responses={200: ResponseSpec(TokenizeResponse, description="The ids"), **ERRORS},
    status_code=200,
)
async def tokenize(request: Request[Any, Any, Any]) -> Response[Any]:
    body = decode(await request.body() or b"{}", TokenizeBody)
    manager = await state(request).manager_for(request, body.model)
    served_model(manager, body.model, openai_not_found)
    ids = await _ids(manager, body)
    tokens: list[int | Piece] = list(ids)
    if body.with_pieces:
        tokens = list(await _off_loop(len(ids), _pieces, manager, ids))
    return json_response(TokenizeResponse(tokens, len(ids), manager.context_length))


@post(
    "/detokenize",
    summary="llama-server / vLLM: token ids as text (special tokens spelled out)",
    responses={200: ResponseSpec(DetokenizeResponse, description="The text"), **ERRORS},
    status_code=200,
)
async def detokenize(request: Request[Any, Any, Any]) -> Response[Any]:
    body = decode(await request.body() or b"{}", DetokenizeBody)
    manager = await state(request).manager_for(request, body.model)
    served_model(manager, body.model, openai_not_found)
    _check_ids(manager, body.tokens)
    text = await _off_loop(len(body.tokens), _text, manager, body.tokens)
    return json_response(DetokenizeResponse(text, text))


async def _ids(manager: TokenizerManager, body: TokenizeBody) -> list[int]:
    given = [name for name in ("content", "prompt", "messages") if getattr(body, name) is not None]
    if len(given) != 1:
        message = "give exactly one of 'content', 'prompt' or 'messages'"
        raise bad_request(message + (f", not {' and '.join(given)}" if given else ""), "content")
    if body.messages is not None:  # what the chat route feeds the model, to the id
        chat = ChatRequest(
            model=body.model,
            messages=template_messages(body.messages),
            tools=msgspec.to_builtins(body.tools) if body.tools else None,
            template_kwargs=template_vars(body.chat_template_kwargs, None),
            add_generation_prompt=body.add_generation_prompt,
        )
        return await encode_prompt(manager, chat_text(manager, chat))
    text = body.content if body.content is not None else body.prompt
    assert text is not None
    special = _first_set(body.add_special, body.add_special_tokens, body.prompt is not None)
    return await (encode_prompt if special else encode)(manager, text)


def _first_set(*flags: bool | None) -> bool:
    return next(flag for flag in flags if flag is not None)


def _check_ids(manager: TokenizerManager, ids: Sequence[int]) -> None:
    vocab = manager.tokenizer.vocab_size
    for i, token in enumerate(ids):
        if token >= vocab:
            raise bad_request(
                f"tokens[{i}] = {token} is not a token id of this model "
                f"(its vocabulary has ids 0 to {vocab - 1})",
                f"tokens[{i}]",
            )


def _pieces(manager: TokenizerManager, ids: Sequence[int]) -> list[Piece]:
    return [Piece(token, _piece(manager.tokenizer.piece_bytes(token))) for token in ids]


def _piece(raw: bytes) -> str | list[int]:
    """llama-server's piece: the text, or its byte values where they are not valid UTF-8 alone
    (one token of a multi-byte character)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def _text(manager: TokenizerManager, ids: Sequence[int]) -> str:
    return str(manager.tokenizer.decode(list(ids), skip_special_tokens=False))


async def _off_loop(size: int, work: Callable[..., T], *args: Any) -> T:
    """`work(*args)`, in a thread when `size` ids would hold the event loop up."""
    if size > LONG_TOKENS:
        return await asyncio.to_thread(work, *args)
    return work(*args)


REQUEST_BODIES: dict[str, type] = {"/tokenize": TokenizeBody, "/detokenize": DetokenizeBody}
ROUTES = [tokenize, detokenize]
