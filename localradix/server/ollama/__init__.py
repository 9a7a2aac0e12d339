"""The Ollama API: request bodies (protocol), their translation to the core's OpenAI requests
(request), Ollama's JSON and NDJSON (render), and the routes (models, routes)."""

from localradix.server.ollama.routes import ROUTES, ollama_error

__all__ = ["ROUTES", "ollama_error"]
