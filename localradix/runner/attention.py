"""Moved to localradix.model_api.attention (temporary re-export while branches merge)."""

from localradix.model_api.attention import *  # noqa: F403
