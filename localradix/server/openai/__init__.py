"""The OpenAI API (`/v1/chat/completions`, `/v1/completions`, `/v1/models`): the core's own
request language, rendered with the response Structs of `server/protocol.py`."""

from localradix.server.openai.routes import ROUTES

__all__ = ["ROUTES"]
