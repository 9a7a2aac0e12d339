"""Moved to localradix.model_api.tp_comm (temporary re-export while branches merge)."""

from localradix.model_api.tp_comm import *  # noqa: F403
