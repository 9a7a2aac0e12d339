"""`localradix`: one CLI, subcommands registered in COMMANDS and imported only when used.

Adding a subcommand is one line in COMMANDS: (module, function that adds its parser to the
subparsers, function that runs it and returns an exit status). The modules named here must stay
light at import time (no torch), so `localradix --help` answers fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple


class Command(NamedTuple):
    module: str
    add_parser: str  # add_parser(subparsers) -> None: creates the subcommand's parser
    run: str  # run(namespace) -> int


COMMANDS: dict[str, Command] = {
    "serve": Command("localradix.serve_command", "add_serve_parser", "run_serve"),
    "bench": Command("localradix.bench", "add_bench_parser", "run_bench"),
    "doctor": Command("localradix.doctor", "add_doctor_parser", "run_doctor"),
    "tui": Command("localradix.tui", "add_tui_parser", "run_tui"),
    "up": Command("localradix.tui", "add_up_parser", "run_default"),  # serve + attach the TUI
    "pull-bundled": Command("localradix.store.bundled", "add_pull_parser", "run_pull"),
    "pull": Command("localradix.store.commands", "add_pull_parser", "run_pull"),
    "ls": Command("localradix.store.commands", "add_ls_parser", "run_ls"),
    "rm": Command("localradix.store.commands", "add_rm_parser", "run_rm"),
    "alias": Command("localradix.store.commands", "add_alias_parser", "run_alias"),
    "run": Command("localradix.chat_repl", "add_run_parser", "run_chat"),
    "ps": Command("localradix.ps", "add_ps_parser", "run_ps"),
    "cache": Command("localradix.cache_command", "add_cache_parser", "run_cache"),
}
# What a bare `localradix` (or `localradix --model X.gguf`) runs: a server with the TUI on it.
DEFAULT_COMMAND: str | None = "up"
_TOP_LEVEL_FLAGS = ("-h", "--help", "--version")


def build_parser() -> argparse.ArgumentParser:
    from localradix import __version__

    parser = argparse.ArgumentParser(
        prog="localradix",
        description="A local LLM server with a radix-tree prefix cache and an OpenAI API.",
    )
    parser.add_argument("--version", action="version", version=f"localradix {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS.values():
        try:
            module = importlib.import_module(command.module)
        except ImportError as exc:
            if exc.name and command.module.startswith(exc.name):
                continue  # the subcommand's module is not installed (yet)
            raise
        getattr(module, command.add_parser)(subparsers)
    return parser


def setup_logging(level: str = "info") -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    if level.lower() != "debug":
        for handler in logging.getLogger().handlers:
            handler.addFilter(_hide_startup_traceback)


def _hide_startup_traceback(record: logging.LogRecord) -> bool:
    """Below debug, drop the ~70-line traceback uvicorn logs when the app's startup fails (an
    unsupported architecture, a missing file): the server logs the reason in one line and exits
    with `localradix: error: REASON`; `--log-level debug` keeps the traceback."""
    if not record.name.startswith("uvicorn"):
        return True
    return "Traceback (most recent call last)" not in record.getMessage().split("\n", 1)[0]


def namespace_shadow(folder: Path) -> Path | None:
    """`folder/localradix` if it is a source checkout (a folder without __init__.py holding the
    package): a script run from `folder` would import it as an empty namespace package and fail
    with "cannot import name 'Engine' from 'localradix' (unknown location)"."""
    clone = folder / "localradix"
    if (clone / "localradix" / "__init__.py").is_file() and not (clone / "__init__.py").exists():
        return clone
    return None


def _warn_namespace_shadow() -> None:
    clone = namespace_shadow(Path.cwd())
    if clone is not None:
        print(
            f"localradix: note: Python scripts run from {Path.cwd()} import the source checkout "
            f"{clone} as an empty namespace package (\"cannot import name 'Engine' from "
            "'localradix' (unknown location)\"): run them from another folder, or from inside "
            "the checkout",
            file=sys.stderr,
        )


def with_default_command(argv: Sequence[str]) -> list[str]:
    """A bare `localradix`, or one whose first argument is a flag, runs DEFAULT_COMMAND."""
    argv = list(argv)
    if DEFAULT_COMMAND is not None and (
        not argv or (argv[0].startswith("-") and argv[0] not in _TOP_LEVEL_FLAGS)
    ):
        argv = [DEFAULT_COMMAND, *argv]
    return argv


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(with_default_command(sys.argv[1:] if argv is None else argv))
    if ns.command is None:
        parser.print_help()
        return 0
    setup_logging(getattr(ns, "log_level", "info"))
    _warn_namespace_shadow()
    command = COMMANDS[ns.command]
    run = getattr(importlib.import_module(command.module), command.run)
    from localradix.store.source import ModelSourceError

    try:
        if ns.command == "up" and getattr(ns, "model", None) is None:
            _fetch_bundled()  # in the foreground: `up`'s server logs hide behind the dashboard
        return int(run(ns) or 0)
    except ModelSourceError as exc:  # a user error with its own advice: no traceback
        print(f"localradix: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _fetch_bundled() -> None:
    from localradix.store.bundled import ensure_bundled

    ensure_bundled()


if __name__ == "__main__":
    sys.exit(main())
