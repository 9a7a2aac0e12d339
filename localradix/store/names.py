"""Names in the store: quant tags, GGUF file choices (split shards grouped), derived aliases.

A GGUF repo usually holds one file per quantization (`Model-7B-Q4_K_M.gguf`), or several
shards of one (`Model-7B-Q8_0-00001-of-00003.gguf`); each such group is one `GgufChoice`,
picked by its quant tag, case-insensitively. An alias is `family:size-quant` in lower case,
e.g. `smollm2:135m-q4_1`, read from the file or repo name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from localradix.store.errors import StoreError

# llama.cpp's quantization names as they appear in file names: Q4_K_M, IQ2_XXS, Q8_0, BF16, ...
QUANT = re.compile(
    r"(?<![A-Za-z0-9])(I?Q\d+(?:_[A-Z0-9]+)*|TQ\d_\d|MXFP4|BF16|FP16|F16|FP32|F32)(?![A-Za-z0-9])",
    re.IGNORECASE,
)
SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
SIZE = re.compile(r"\d+(?:\.\d+)?(?:x\d+(?:\.\d+)?)?[bmkt]", re.IGNORECASE)
_REPO_SUFFIX = re.compile(r"[-_.](gguf|mlx)$", re.IGNORECASE)


@dataclass(frozen=True)
class GgufChoice:
    """One loadable GGUF model in a repo: a single file, or all shards of a split one."""

    label: str  # the quant tag as the file names it (Q4_K_M), else the file's stem
    files: tuple[str, ...]  # repo paths; shards in order, the first one is the one to load
    size: int | None  # bytes, when the hub said

    @property
    def complete(self) -> bool:
        """Whether `files` are all the shards the names announce (always true unsplit)."""
        match = SHARD.search(self.files[0])
        return match is None or len(self.files) == int(match.group(2))


def quant_of(filename: str) -> str | None:
    """The quant tag in a GGUF file name (the last one, as in `Model-Q4_K_M.gguf`)."""
    matches = QUANT.findall(gguf_stem(filename))
    return matches[-1] if matches else None


def gguf_stem(filename: str) -> str:
    """The file name without folder, `.gguf` and split-shard suffix."""
    name = filename.rsplit("/", 1)[-1]
    name = SHARD.sub("", name)
    return name[:-5] if name.lower().endswith(".gguf") else name


def is_model_gguf(filename: str) -> bool:
    """A GGUF holding a language model (not a vision projector or an imatrix)."""
    name = filename.rsplit("/", 1)[-1].lower()
    return name.endswith(".gguf") and not name.startswith(("mmproj", "imatrix"))


def gguf_choices(sizes: Mapping[str, int | None]) -> list[GgufChoice]:
    """Group a repo's GGUF files (path -> size) into choices, ordered by label."""
    groups: dict[str, list[str]] = {}
    for path in sorted(p for p in sizes if is_model_gguf(p)):
        key = SHARD.sub("", path)
        groups.setdefault(key, []).append(path)
    labels = [quant_of(key) or gguf_stem(key) for key in groups]
    unique = {label.lower() for label in labels}
    if len(unique) < len(labels):  # two files share a tag (two models in one repo): use stems
        labels = [gguf_stem(key) for key in groups]
    choices = [
        GgufChoice(label, tuple(files), _total(sizes[f] for f in files))
        for label, files in zip(labels, groups.values())
    ]
    return sorted(choices, key=lambda c: c.label.lower())


def select_choice(repo: str, choices: list[GgufChoice], tag: str | None) -> GgufChoice:
    """The choice `tag` names: exact (any case), else a unique prefix (`q8` -> Q8_0)."""
    if tag is None:
        if len(choices) == 1:
            return choices[0]
        raise StoreError(
            f"{repo} has {len(choices)} GGUF files: {describe_choices(choices)}; pick one, "
            f"e.g. `localradix pull {repo}:{choices[0].label}`"
        )
    exact = [c for c in choices if c.label.lower() == tag.lower()]
    if exact:
        return exact[0]
    prefixed = [c for c in choices if c.label.lower().startswith(tag.lower())]
    if len(prefixed) == 1:
        return prefixed[0]
    what = "matches several" if prefixed else "is not one"
    shown = prefixed or choices
    raise StoreError(
        f"quant {tag!r} {what} of {repo}'s GGUF files: {describe_choices(shown)}; "
        f"pick one, e.g. `localradix pull {repo}:{shown[0].label}`"
    )


def describe_choices(choices: Iterable[GgufChoice]) -> str:
    return ", ".join(f"{c.label} ({human_size(c.size)})" for c in choices)


def split_ref(ref: str) -> tuple[str, str | None]:
    """`org/name:Q4_K_M` -> ("org/name", "Q4_K_M"); `org/name` -> ("org/name", None)."""
    repo, sep, tag = ref.partition(":")
    return repo, (tag or None) if sep else None


def is_repo_id(text: str) -> bool:
    parts = text.split("/")
    return len(parts) == 2 and all(re.fullmatch(r"[A-Za-z0-9_.-]+", p) for p in parts)


def derive_alias(names: Iterable[str], variant: str | None) -> str:
    """`family:size-variant` from the first name holding a size (`SmolLM2-135M-Instruct`,
    "Q4_1" -> `smollm2:135m-q4_1`); `family:variant` (or `:latest`) when none does."""
    cleaned = [_clean(n) for n in names if n]
    for name in cleaned:
        tokens = re.split(r"[-_ ]+", name)
        sizes = [i for i, t in enumerate(tokens) if i > 0 and SIZE.fullmatch(t)]
        if sizes:
            i = sizes[0]
            return _alias("-".join(tokens[:i]), tokens[i], variant)
    return _alias(cleaned[0] if cleaned else "model", None, variant)


def _clean(name: str) -> str:
    """A repo or file name without org, quant tag and `-GGUF`/`-MLX` suffix."""
    name = gguf_stem(name.rsplit("/", 1)[-1])
    quant = quant_of(name + ".gguf")
    if quant is not None:
        name = name[: name.lower().rfind(quant.lower())]
    return _REPO_SUFFIX.sub("", name.strip("-_. "))


def _alias(family: str, size: str | None, variant: str | None) -> str:
    tag = "-".join(t for t in (size, variant) if t) or "latest"
    return f"{family}:{tag}".lower().replace(" ", "-")


def human_size(size: int | None) -> str:
    if size is None:
        return "size unknown"
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def _total(sizes: Iterable[int | None]) -> int | None:
    values = list(sizes)
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)
