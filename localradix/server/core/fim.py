"""Fill-in-the-middle: the model's own FIM tokens, and prompts built from them as token ids.

The tokens come from the tokenizer: a GGUF's `tokenizer.ggml.fim_*_token_id` (carried as
`fim_pre_token`, ... special tokens) or the known spellings of the code-model families. A prompt
is PRE prefix SUF suffix MID (prefix-suffix-middle), the FIM tokens put in as ids (never
spelled as text for the tokenizer to find).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from localradix.server.errors import bad_request

# (prefix, suffix, middle, repo name, file separator) per family; the first all-present wins.
FAMILIES = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>"),
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<repo_name>", "<file_sep>"),
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>", "", ""),  # DeepSeek-Coder
    ("▁<PRE>", "▁<SUF>", "▁<MID>", "", ""),  # CodeLlama
    ("<PRE>", "<SUF>", "<MID>", "", ""),
)
GGUF_KEYS = ("fim_pre_token", "fim_suf_token", "fim_mid_token", "fim_rep_token", "fim_sep_token")


@dataclass(frozen=True)
class FimTokens:
    prefix: int
    suffix: int
    middle: int
    repo: int | None = None  # repo-level FIM (llama.cpp's FIM_REP / FIM_SEP), when present
    file_sep: int | None = None


def fim_tokens(tokenizer: Any) -> FimTokens | None:
    """The model's FIM tokens, or None when it has none."""
    lookup = getattr(tokenizer, "token_to_id", None)
    if lookup is None:
        return None
    specials = getattr(tokenizer, "special_tokens", {})
    from_gguf = tuple(specials.get(key, "") for key in GGUF_KEYS)
    for names in (from_gguf, *FAMILIES):
        ids = [lookup(name) if name else None for name in names]
        if ids[0] is not None and ids[1] is not None and ids[2] is not None:
            return FimTokens(ids[0], ids[1], ids[2], ids[3], ids[4])
    return None


def require_fim(tokenizer: Any, param: str) -> FimTokens:
    """The FIM tokens, or a 400 saying the model has none."""
    fim = fim_tokens(tokenizer)
    if fim is None:
        raise bad_request(
            f"'{param}' needs fill-in-the-middle, and this model has no FIM tokens "
            "(use a code model such as Qwen2.5-Coder, StarCoder2, CodeLlama or DeepSeek-Coder)",
            param,
        )
    return fim


def fim_prompt(
    fim: FimTokens,
    prefix: Sequence[int],
    suffix: Sequence[int],
    context: Sequence[int] = (),
    after_middle: Sequence[int] = (),
    lead: Sequence[int] = (),
) -> list[int]:
    """lead context PRE prefix SUF suffix MID after_middle (llama.cpp's /infill puts its
    `prompt` after MID, and the other files' context first); `lead`: the BOS the model's
    tokenizer puts before every prompt (TokenizerManager.prompt_lead), first of all."""
    middle = [fim.prefix, *prefix, fim.suffix, *suffix, fim.middle, *after_middle]
    return [*lead, *context, *middle]


SNIPPET = "\n\n--- snippet ---\n\n"  # llama.cpp's chunk separator without repo-level tokens


def repo_context(
    fim: FimTokens, encode: Callable[[str], list[int]], files: Sequence[tuple[str, str]]
) -> list[int]:
    """Other files (name, text) before the FIM prompt, as llama.cpp's /infill lays them out:
    REP "myproject\n" (SEP "name\n" text)... SEP "filename\n" with repo-level tokens, else
    each text after a snippet separator."""
    if fim.repo is None or fim.file_sep is None:
        return [t for _, text in files for t in encode(SNIPPET) + encode(text)]
    out = [fim.repo, *encode("myproject\n")]
    for name, text in files:
        out += [fim.file_sep, *encode(name + "\n"), *encode(text)]
    return [*out, fim.file_sep, *encode("filename\n")]
