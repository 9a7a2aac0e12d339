"""A name to a store entry: a user alias, a derived alias, `REPO:QUANT`, `REPO`, or `bundled`.

Matching is case-insensitive. A name that fits two entries is an error that lists them, never a
silent pick; a quant may be given by a unique prefix (`org/name:q8` for Q8_0).
"""

from __future__ import annotations

from localradix.store.aliases import load_aliases
from localradix.store.catalog import BUNDLED_REF, StoreEntry, scan
from localradix.store.errors import StoreError
from localradix.store.names import split_ref


def find_entry(name: str, entries: list[StoreEntry] | None = None) -> StoreEntry | None:
    """The one entry `name` names, None if none does; StoreError if several do."""
    entries = scan() if entries is None else entries
    wanted = load_aliases().get(name.lower(), name)
    by_alias = [e for e in entries if e.alias == wanted.lower()]
    matches = by_alias or _by_ref(wanted, entries)
    if len(matches) > 1:
        refs = ", ".join(e.ref for e in matches)
        raise StoreError(
            f"{name!r} matches {len(matches)} models ({refs}): name one of them, or give one a "
            f"name of its own: `localradix alias {matches[0].ref} NEW-NAME`"
        )
    return matches[0] if matches else None


def _by_ref(ref: str, entries: list[StoreEntry]) -> list[StoreEntry]:
    from localradix.store.bundled import SMOLLM2

    if ref.lower() in (BUNDLED_REF, SMOLLM2.name.lower()):
        return [e for e in entries if e.repo is None]
    repo, tag = split_ref(ref)
    same_repo = [e for e in entries if e.repo is not None and e.repo.lower() == repo.lower()]
    if tag is None:
        return same_repo
    tag = tag.lower()
    exact = [e for e in same_repo if (e.variant or "").lower() == tag]
    return exact or [e for e in same_repo if (e.variant or "").lower().startswith(tag)]
