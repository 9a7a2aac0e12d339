"""`pull REPO[:QUANT]`: pick the files a model needs, download them, check them.

GGUF repos: the file (or all shards) of one quant. Safetensors and MLX repos: config,
tokenizer, chat template, generation config and weights, nothing else (no README, no ONNX or
PyTorch copies). A pull that fails leaves no half model behind: a checked file that is broken is
deleted; a cut download keeps only finished files, which the next pull reuses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from localradix.store.catalog import StoreEntry, repo_dir, snapshot_entries
from localradix.store.errors import StoreError
from localradix.store.names import gguf_choices, human_size, is_repo_id, select_choice, split_ref

# The files of a Hugging Face model folder that loading it reads (weights are added by name).
FOLDER_FILES = frozenset({
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "tokenizer.model", "special_tokens_map.json", "vocab.json", "merges.txt",
    "added_tokens.json", "chat_template.jinja", "chat_template.json",
    "model.safetensors.index.json", "pytorch_model.bin.index.json",
})  # fmt: skip


@dataclass(frozen=True)
class PullPlan:
    repo: str
    variant: str | None  # the GGUF quant picked; None for a folder
    files: tuple[str, ...]
    size: int | None


def plan_pull(repo: str, sizes: dict[str, int | None], tag: str | None) -> PullPlan:
    """Which of the repo's files (path -> size) to fetch for `tag`."""
    choices = [c for c in gguf_choices(sizes) if c.complete]
    folder = folder_files(sizes)
    if tag is None and folder:
        return PullPlan(repo, None, folder, _sum(sizes[f] for f in folder))
    if choices:
        choice = select_choice(repo, choices, tag)
        return PullPlan(repo, choice.label, choice.files, choice.size)
    if folder:
        raise StoreError(
            f"{repo} has no GGUF files, so no quant {tag!r} to pick: `localradix pull {repo}`"
        )
    raise StoreError(
        f"{repo} holds no model files (no .gguf, no config.json with .safetensors weights): "
        "pull a repo that has them, e.g. one whose name ends in -GGUF"
    )


def folder_files(sizes: dict[str, int | None]) -> tuple[str, ...]:
    """A Hugging Face folder's needed files, or () if the repo is not one."""
    top = [f for f in sizes if "/" not in f]
    weights = [f for f in top if f.endswith(".safetensors")] or [
        f for f in top if f.startswith("pytorch_model") and f.endswith(".bin")
    ]
    if "config.json" not in top or not weights:
        return ()
    return tuple(sorted({*weights, *(f for f in top if f in FOLDER_FILES)}))


def pull(
    ref: str, revision: str = "main", on_plan: Callable[[PullPlan], None] | None = None
) -> StoreEntry:
    """Download `ref` into the store and return its entry; `on_plan` hears what will be
    fetched before the download starts (the API's progress)."""
    from localradix.store import hub

    repo, tag = split_ref(ref)
    if not is_repo_id(repo):
        raise StoreError(
            f"{ref!r} is not a repo id: give ORG/NAME[:QUANT] as in the repo's address, "
            "e.g. `localradix pull bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M`"
        )
    try:
        sizes = hub.repo_files(repo, revision)
    except hub.HubUnreachable:
        local = _already_pulled(ref)
        if local is None:
            raise
        print(f"{local.ref} is in the store; the hub did not answer, so it is not updated")
        return local
    plan = plan_pull(repo, sizes, tag)
    if on_plan is not None:
        on_plan(plan)
    print(f"pulling {plan.repo}: {', '.join(plan.files)} ({human_size(plan.size)})", flush=True)
    existed = repo_dir(repo).exists()
    try:
        snapshot = hub.download(repo, revision, list(plan.files))
        entry = _entry_of(plan, snapshot)
        _check_or_remove(entry)
    except BaseException:
        _forget_if_empty(repo, existed)
        raise
    return entry


def _already_pulled(ref: str) -> StoreEntry | None:
    from localradix.store.lookup import find_entry

    try:
        return find_entry(ref)
    except StoreError:  # several quants of the repo: the pull names none of them
        return None


def _entry_of(plan: PullPlan, snapshot: Path) -> StoreEntry:
    """The store entry the downloaded files make; else they are removed (an encoder, say)."""
    from localradix.store.remove import remove_files

    for entry in snapshot_entries(plan.repo, snapshot):
        if entry.variant == plan.variant and (plan.variant is not None or entry.format != "gguf"):
            return entry
    remove_files(plan.repo, [snapshot / f for f in plan.files])
    raise StoreError(
        f"{plan.repo} is not a model that generates text (see its config.json "
        '"architectures"); its files were removed. Pull a causal language model'
    )


def _check_or_remove(entry: StoreEntry) -> None:
    from localradix.store.check import check_entry
    from localradix.store.remove import remove_entry

    try:
        check_entry(entry)
    except StoreError as exc:
        remove_entry(entry)
        raise StoreError(
            f"{entry.ref} is broken in the repo: {exc}; its files were removed. Pick another "
            "quant or repo, or tell the repo's owner"
        ) from None


def _forget_if_empty(repo: str, existed: bool) -> None:
    """After a failed first pull, drop the repo folder unless a finished file is in it."""
    folder = repo_dir(repo)
    blobs = folder / "blobs"
    finished = blobs.is_dir() and any(not p.name.endswith(".incomplete") for p in blobs.iterdir())
    if not existed and not finished:
        from localradix.store.remove import remove_repo

        remove_repo(repo)


def _sum(sizes: Iterable[int | None]) -> int | None:
    values = list(sizes)
    return None if any(v is None for v in values) else sum(v or 0 for v in values)
