"""The Ollama API: request bodies (protocol), their translation to the core's OpenAI requests
(request), Ollama's JSON and NDJSON (render), and the routes (models, routes)."""

from localradix.server.ollama.routes import ROUTES

__all__ = ["ROUTES"]
