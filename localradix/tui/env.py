"""Where the dashboard (and `localradix ps`) look for a server unless told: its URL and key."""

from __future__ import annotations

DEFAULT_URL = "http://127.0.0.1:8000"
URL_ENV, KEY_ENV = "LOCALRADIX_URL", "LOCALRADIX_API_KEY"
