"""Deleting a model from the hub cache: its snapshot links, the blobs no other link uses, and
the repo's folder once no model is left in it (refs, tree listings, locks included)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from localradix.store.catalog import StoreEntry, hub_cache, repo_dir


def remove_model(entry: StoreEntry) -> None:
    """A model's files, then the aliases naming it (the rm command, Ollama's /api/delete)."""
    from localradix.store.aliases import drop_aliases_of

    remove_entry(entry)
    drop_aliases_of(entry.ref)


def remove_entry(entry: StoreEntry) -> None:
    assert entry.repo is not None, "the bundled model is not removable"
    remove_files(entry.repo, entry.files)


def remove_files(repo: str, files: Iterable[Path]) -> None:
    """Delete these snapshot files of `repo`, then what is left empty."""
    folder = repo_dir(repo)
    for path in files:
        _remove_file(path, folder)
    prune(repo)


def remove_repo(repo: str) -> bool:
    """Delete everything the cache holds for `repo` (a partial pull, say); False if nothing."""
    folder = repo_dir(repo)
    if not folder.exists():
        return False
    shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(hub_cache() / ".locks" / folder.name, ignore_errors=True)
    return True


def prune(repo: str) -> None:
    """Drop the repo's empty snapshots, and the whole repo folder when no file is left."""
    snapshots = repo_dir(repo) / "snapshots"
    for snapshot in snapshots.iterdir() if snapshots.is_dir() else []:
        if not any(p.is_file() for p in snapshot.rglob("*")):
            shutil.rmtree(snapshot, ignore_errors=True)
    if not snapshots.is_dir() or not any(snapshots.iterdir()):
        remove_repo(repo)


def _remove_file(path: Path, folder: Path) -> None:
    """Unlink a snapshot file; its blob goes too unless another snapshot link points at it."""
    blob = path.resolve() if path.is_symlink() else None
    path.unlink(missing_ok=True)
    if blob is not None and not _linked(blob, folder / "snapshots"):
        blob.unlink(missing_ok=True)
    _remove_empty_parents(path.parent, folder / "snapshots")


def _linked(blob: Path, snapshots: Path) -> bool:
    return any(
        p.is_symlink() and p.resolve() == blob for p in snapshots.rglob("*") if not p.is_dir()
    )


def _remove_empty_parents(folder: Path, stop: Path) -> None:
    while folder != stop and stop in folder.parents:
        try:
            os.rmdir(folder)
        except OSError:
            return
        folder = folder.parent
