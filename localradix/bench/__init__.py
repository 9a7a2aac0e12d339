"""`localradix bench`: the same seeded workload against any OpenAI-compatible server.

Only argparse is imported here; httpx, tqdm and matplotlib load when a benchmark runs.
"""

from __future__ import annotations

import argparse

from localradix.bench.options import build_parser

__all__ = ["add_bench_parser", "run_bench"]


def add_bench_parser(subparsers) -> None:
    """Add the `bench` subcommand to a `parser.add_subparsers()` object."""
    p = subparsers.add_parser(
        "bench",
        help="benchmark localradix or any OpenAI-compatible server",
    )
    build_parser(p)
    p.set_defaults(func=run_bench)


def run_bench(ns: argparse.Namespace) -> int:
    """Run the benchmark described by parsed `bench` arguments; returns the exit status."""
    from localradix.bench.main import main

    return main(ns)
