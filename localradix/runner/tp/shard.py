"""Moved to localradix.model_api.shard (temporary re-export while branches merge)."""

from localradix.model_api.shard import *  # noqa: F403
