"""The one check that a request names the model this manager serves (or none), worded as the
asking dialect words a missing model."""

from __future__ import annotations

from collections.abc import Callable

from localradix.server.errors import APIError
from localradix.server.tokenizer_manager import TokenizerManager

NotServed = Callable[[str, str], APIError]  # (asked, served) -> the dialect's 404


def served_name(manager: TokenizerManager) -> str:
    return manager.client.loaded.name


def not_found(model: str, served: str) -> APIError:
    """The other dialects' words (Anthropic, Ollama)."""
    return APIError(404, f"model '{model}' not found; this server serves '{served}'")


def openai_not_found(model: str, served: str) -> APIError:
    """OpenAI's words, naming the parameter."""
    return APIError(
        404,
        f"the model '{model}' does not exist; this server serves '{served}'",
        param="model",
        code="model_not_found",
        type="invalid_request_error",
    )


def served_model(
    manager: TokenizerManager,
    model: str | None,
    missing: NotServed = not_found,
    latest_ok: bool = False,
) -> str:
    """The served model's name, if `model` names it, one of its names or none; `missing`'s
    404 otherwise (`latest_ok`: Ollama's `:latest` tag names it too)."""
    served = served_name(manager)
    if model is None or model == served or model in manager.names:
        return served
    if latest_ok and (
        model == f"{served}:latest" or model.removesuffix(":latest") in manager.names
    ):
        return served
    raise missing(model, served)
