"""OpenAI's Responses API: request bodies (protocol), their translation to the core's OpenAI
chat request (request), the response object (render), the SSE events (stream), the responses
kept for previous_response_id (store), and the routes."""

from localradix.server.responses.routes import ROUTES

__all__ = ["ROUTES"]
