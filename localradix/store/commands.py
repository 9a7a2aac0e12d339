"""The store's subcommands: pull, ls, rm and alias (light to import: no hub, no
torch until a command runs)."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from localradix.store.errors import StoreError


def add_pull_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "pull",
        help="download a model from the Hugging Face hub: REPO[:QUANT]",
        description="Download a model into the store (the Hugging Face hub cache): "
        "`ORG/NAME:Q4_K_M` picks a GGUF repo's file by quant tag (any case; split shards are "
        "all fetched); `ORG/NAME` of a safetensors or MLX repo fetches the files a model needs. "
        "HF_TOKEN, HF_ENDPOINT and HF_HOME are honoured; an interrupted pull resumes.",
    )
    p.add_argument("model", metavar="REPO[:QUANT]")
    p.add_argument("--revision", default="main", help="branch, tag or commit (default: main)")


def run_pull(ns: argparse.Namespace) -> int:
    from localradix.store.lookup import find_entry

    _quiet_http_logs()
    from localradix.store.names import human_size

    local = None if "/" in ns.model else find_entry(ns.model)
    if local is not None and local.repo is None:  # the bundled model, by its alias
        from localradix.store.bundled import ensure_bundled

        print(ensure_bundled())
        return 0
    from localradix.store.pull import pull

    entry = pull(ns.model, ns.revision)
    print(f"pulled {entry.ref} ({human_size(entry.size)}) as {entry.alias}: {entry.path}")
    return 0


def add_ls_parser(subparsers: Any) -> None:
    subparsers.add_parser(
        "ls",
        help="list the models in the store",
        description="List the models in the store (the Hugging Face hub cache, and the bundled "
        "model): name, repo, format, quantization, size on disk, architecture, context length.",
    )


def run_ls(ns: argparse.Namespace) -> int:
    from localradix.store.aliases import load_aliases
    from localradix.store.catalog import describe, scan
    from localradix.store.names import human_size

    named = {target.lower(): alias for alias, target in load_aliases().items()}
    rows = [("NAME", "MODEL", "FORMAT", "QUANT", "SIZE", "ARCH", "CONTEXT")]
    for entry in scan():
        facts = describe(entry)
        size = human_size(entry.size) if entry.path else "(fetched on first use)"
        rows.append((
            named.get(entry.ref.lower(), entry.alias), entry.ref, entry.format,
            entry.quantization, size, facts.architecture if facts else "-",
            str(facts.context_length or "-") if facts else "-",
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0


def add_rm_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "rm",
        help="delete a model's files from the store",
        description="Delete a model's files from the Hugging Face hub cache (asks first).",
    )
    p.add_argument("model", metavar="NAME", help="an alias, REPO:QUANT or REPO")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask")


def run_rm(ns: argparse.Namespace) -> int:
    from localradix.store.lookup import find_entry
    from localradix.store.names import human_size, split_ref
    from localradix.store.remove import remove_model, remove_repo

    entry = find_entry(ns.model)
    if entry is None:
        if "/" in ns.model and _confirm(f"remove the partial download of {ns.model}?", ns.yes):
            if remove_repo(split_ref(ns.model)[0]):
                print(f"removed the partial download of {ns.model}")
                return 0
        raise StoreError(f"no model {ns.model!r} in the store: `localradix ls` lists them")
    if entry.repo is None:
        raise StoreError("the bundled model is always kept: there is nothing to remove")
    if not _confirm(f"remove {entry.ref} ({human_size(entry.size)})?", ns.yes):
        print("kept", entry.ref)
        return 1
    remove_model(entry)
    print(f"removed {entry.ref}")
    return 0


def add_alias_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "alias",
        help="give a model in the store a name of your own",
        description="Name a model in the store (kept in aliases.json in localradix's cache "
        "folder, which may be edited by hand).",
    )
    p.add_argument("model", metavar="NAME", help="an alias, REPO:QUANT or REPO")
    p.add_argument("alias", metavar="NEW", help="the new name, e.g. coder:7b")


def run_alias(ns: argparse.Namespace) -> int:
    from localradix.store.aliases import check_alias, set_alias
    from localradix.store.lookup import find_entry

    entry = find_entry(ns.model)
    if entry is None:
        raise StoreError(f"no model {ns.model!r} in the store: `localradix ls` lists them")
    set_alias(ns.alias, entry.ref)
    print(f"{check_alias(ns.alias)} -> {entry.ref}")
    return 0


def _quiet_http_logs() -> None:
    """No log line per HTTP request (the progress bars tell); huggingface-hub's warnings (a
    resumed download) keep its own handler, without a second copy through ours."""
    for name in ("httpx", "httpx2"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("huggingface_hub").propagate = False


def _confirm(question: str, yes: bool) -> bool:
    if yes:
        return True
    if not sys.stdin.isatty():
        raise StoreError(f"{question[:-1]}: pass --yes to confirm when not at a terminal")
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")
