"""`localradix serve`: one server, or with `--replicas N`, N of them behind a gateway that this
process supervises (`fleet/`)."""

from __future__ import annotations

import argparse

from localradix.config import args_from_namespace
from localradix.server.launch import add_serve_parser as add_serve_parser  # (cli.COMMANDS)


def run_serve(ns: argparse.Namespace) -> int:
    args = args_from_namespace(ns)
    if args.replicas != 1:
        from localradix.fleet.supervisor import run_fleet

        return run_fleet(args)
    from localradix.server.launch import serve

    return serve(args)
