"""Anthropic's Messages API: request bodies (protocol), their translation to the core's OpenAI
chat request (request), the message body and errors (render), the SSE events (stream), and the
routes."""

from localradix.server.anthropic.render import error_body
from localradix.server.anthropic.routes import ROUTES

__all__ = ["ROUTES", "error_body"]
