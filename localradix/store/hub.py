"""The calls to huggingface-hub (imported here only, and only when a function runs).

The hub client reads `HF_ENDPOINT`, `HF_TOKEN`, `HF_HOME`/`HF_HUB_CACHE` and `HF_HUB_OFFLINE`
itself; downloads go through `snapshot_download`, so its progress bars, its cache layout and
its resume of a cut connection (a Range request for the rest) are the ones every hub tool has.
Its errors become one-line `StoreError`s that say what to do.
"""

from __future__ import annotations

from pathlib import Path

from localradix.store.errors import StoreError


class HubUnreachable(StoreError):
    """No answer from the hub: offline mode, or no connection."""


def endpoint() -> str:
    from huggingface_hub import constants

    return str(constants.ENDPOINT)


def repo_files(repo: str, revision: str) -> dict[str, int | None]:
    """The repo's files (path -> size in bytes) at `revision`."""
    from huggingface_hub import HfApi

    try:
        info = HfApi().model_info(repo, revision=revision, files_metadata=True)
    except Exception as exc:
        raise hub_error(exc, repo, revision) from None
    return {s.rfilename: s.size for s in info.siblings or []}


def download(repo: str, revision: str, files: list[str]) -> Path:
    """Fetch `files` of the repo into the hub cache; returns the snapshot folder."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo, revision=revision, allow_patterns=files))
    except Exception as exc:
        raise hub_error(exc, repo, revision) from None


def hub_error(exc: Exception, repo: str, revision: str) -> Exception:
    """A StoreError saying what went wrong and what to do (other errors are returned as is)."""
    import httpx2
    from huggingface_hub import errors
    from huggingface_hub.utils import OfflineModeIsEnabled

    where = endpoint()
    if isinstance(exc, OfflineModeIsEnabled) or (
        isinstance(exc, errors.LocalEntryNotFoundError) and _offline()
    ):
        return HubUnreachable(
            f"cannot pull {repo}: HF_HUB_OFFLINE is set; unset it to download (models already "
            "pulled load offline: `localradix ls`)"
        )
    if isinstance(exc, errors.GatedRepoError):
        return StoreError(
            f"{repo} is gated on {where}: accept its terms on the repo's page, then set HF_TOKEN "
            "to a token of that account"
        )
    if isinstance(exc, errors.RevisionNotFoundError):
        return StoreError(f"{repo} has no revision {revision!r} on {where}: drop --revision")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return StoreError(
            f"no model repo {repo!r} on {where}: check the name (ORG/NAME, as in the repo's "
            "address); for a private or gated repo set HF_TOKEN"
        )
    if isinstance(exc, errors.HfHubHTTPError):  # an OSError too: test it first
        return StoreError(f"{where} refused {repo}: {_first_line(exc)}")
    if isinstance(exc, (httpx2.TransportError, OSError)):  # a cut connection, a full disk
        return HubUnreachable(
            f"cannot download {repo} from {where} ({_first_line(exc)}): check the network (or "
            "HF_ENDPOINT), then run the same pull again; finished files are kept"
        )
    return exc


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.is_offline_mode())


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:200]
