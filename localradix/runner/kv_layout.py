"""Moved to localradix.model_api.kv_layout (temporary re-export while branches merge)."""

from localradix.model_api.kv_layout import *  # noqa: F403
