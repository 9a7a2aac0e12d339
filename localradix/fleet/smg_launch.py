"""`python -m localradix.fleet.smg_launch launch ARGS...`: smg's own CLI, with the API key
read from $LOCALRADIX_API_KEY instead of the command line (which `ps` shows to every user).

smg sends that key to the replicas (which require it) and requires it from its own clients.
"""

from __future__ import annotations

import os
import sys

API_KEY_ENV = "LOCALRADIX_API_KEY"  # as localradix.server.security


def main(argv: list[str]) -> None:
    key = os.environ.pop(API_KEY_ENV, None)
    from smg.cli import main as smg_main

    smg_main([*argv, *(["--api-key", key] if key else [])])


if __name__ == "__main__":
    main(sys.argv[1:])
