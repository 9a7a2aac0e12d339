"""Rebuild a `tokenizers` tokenizer from GGUF tokenizer metadata.

Byte-level BPE (`tokenizer.ggml.model == "gpt2"`: GPT-2, SmolLM, Llama 3, Qwen) and
SentencePiece-style BPE (`"llama"`: Llama 2, Mistral, TinyLlama). Tokens marked CONTROL become
special added tokens and USER_DEFINED ones plain added tokens, so both are matched whole.

llama.cpp's own vocabulary code is the exact tokenizer of a GGUF (`loader.llama_vocab`); this
rebuild is used without it only for the kinds in EXACT_REBUILDS (`require_exact_rebuild`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, processors
from tokenizers import pre_tokenizers as pre

from localradix.store.source import ModelSourceError

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLITS = {
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "falcon3": _LLAMA3_SPLIT,
    "dbrx": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}


FIM_PARTS = ("fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep")

# (tokenizer.ggml.model, tokenizer.ggml.pre) pairs this rebuild reproduces exactly. Measured
# against llama.cpp (llama-cpp-python 0.3.36, add_special and parse_special off) on every vector
# of its models/ggml-vocab-*.gguf{.inp,.out} (tests/loader/test_vocab_vectors.py), plus 350
# varied strings and 3000 random mixes through the same GGUF with parse_special on: gpt-2 and
# the bundled SmolLM2's smollm (not among the vectors) matched everything. Refused: qwen2 (every
# vector, but not decomposed accents, which the rebuild NFC-normalizes, nor its user-defined
# "</s>"); qwen35, llama-bpe, deepseek-coder/-llm, starcoder, refact, command-r, falcon, mpt and
# llama (SentencePiece: runs of spaces) missed vectors; bert and gemma4 are not rebuilt at all.
EXACT_REBUILDS = frozenset({("gpt2", "gpt-2"), ("gpt2", "smollm")})


def require_exact_rebuild(meta: dict[str, Any]) -> None:
    """Refuse, by name, a tokenizer this rebuild would silently get wrong."""
    kind = meta.get("tokenizer.ggml.model")
    pre_type = meta.get("tokenizer.ggml.pre", "default")
    if (kind, pre_type) not in EXACT_REBUILDS:
        raise ModelSourceError(
            f"GGUF tokenizer {kind!r} with pre-tokenizer {pre_type!r} is not reproduced exactly "
            "without llama.cpp: pip install llama-cpp-python"
        )


def build_gguf_tokenizer(meta: dict[str, Any]) -> tuple[Tokenizer, dict[str, Any]]:
    """(backend tokenizer, HF-style tokenizer_config dict) for a GGUF's metadata."""
    kind = meta.get("tokenizer.ggml.model")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types: list[int] = list(meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens))
    if kind == "gpt2":
        tokenizer, add_bos = _byte_level(meta, tokens), False
    elif kind == "llama":
        tokenizer, add_bos = _sentencepiece(meta, tokens), True
    else:
        raise ValueError(
            f"cannot build a tokenizer for GGUF tokenizer model {kind!r}; supported: gpt2, llama"
        )
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", add_bos))
    _add_special_tokens(tokenizer, tokens, types, byte_level=kind == "gpt2")
    config = _tokenizer_config(meta, tokens, add_bos)
    if add_bos and config["bos_token"] is not None:
        bos = config["bos_token"]
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tokens.index(bos))]
        )
    return tokenizer, config


def _byte_level(meta: dict[str, Any], tokens: list[str]) -> Tokenizer:
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        if not set(token) <= alphabet:  # llama.cpp writes some added tokens as raw text
            token = "".join(spelling[b] for b in token.encode("utf-8"))
        vocab.setdefault(token, index)
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    pre_type = meta.get("tokenizer.ggml.pre", "default")
    byte_level = pre.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre_type in _SPLITS:
        split = pre.Split(Regex(_SPLITS[pre_type]), behavior="isolated")
        byte_level = pre.ByteLevel(add_prefix_space=False, use_regex=False)
        tokenizer.pre_tokenizer = pre.Sequence([split, byte_level])
    elif (
        pre_type == "smollm"
    ):  # digits one by one, then GPT-2 splitting (as SmolLM's tokenizer.json)
        tokenizer.pre_tokenizer = pre.Sequence([pre.Digits(individual_digits=True), byte_level])
    else:
        tokenizer.pre_tokenizer = byte_level
    if pre_type.startswith("qwen2") or pre_type == "deepseek-r1-qwen":
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _sentencepiece(meta: dict[str, Any], tokens: list[str]) -> Tokenizer:
    vocab = {token: index for index, token in enumerate(tokens)}
    if "tokenizer.ggml.merges" in meta:
        merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    else:
        merges = _merges_from_scores(vocab, list(meta.get("tokenizer.ggml.scores") or []))
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None else None
    bpe = models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True)
    tokenizer = Tokenizer(bpe)
    prepend = "first" if meta.get("tokenizer.ggml.add_space_prefix", True) else "never"
    tokenizer.pre_tokenizer = pre.Metaspace(
        replacement="\u2581", prepend_scheme=prepend, split=False
    )
    strip = [decoders.Strip(content=" ", left=1, right=0)] if prepend == "first" else []
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), *strip]
    )
    return tokenizer


def _merges_from_scores(vocab: dict[str, int], scores: list[float]) -> list[tuple[str, str]]:
    """SentencePiece files carry scores, not merges: every split of a token into two known
    pieces is a merge, ranked by the merged token's score (as transformers does)."""
    ranked = []
    for token, index in vocab.items():
        score = scores[index] if index < len(scores) else 0.0
        pairs = [(token[:i], token[i:]) for i in range(1, len(token))]
        pairs = [(a, b) for a, b in pairs if a in vocab and b in vocab]
        pairs.sort(key=lambda p: (vocab[p[0]], vocab[p[1]]))
        ranked += [(score, a, b) for a, b in pairs]
    ranked.sort(key=lambda r: (r[0], len(r[1]), len(r[2])), reverse=True)
    return [(a, b) for _, a, b in ranked]


def _add_special_tokens(
    tokenizer: Tokenizer, tokens: list[str], types: list[int], byte_level: bool
) -> None:
    alphabet = set(_bytes_to_unicode().values()) if byte_level else None
    control = [
        AddedToken(t, special=True, normalized=False)
        for t, kind in zip(tokens, types, strict=False)
        if kind == CONTROL and (alphabet is None or set(t) <= alphabet)
    ]
    tokenizer.add_special_tokens(control)
    user = [
        AddedToken(t, special=False, normalized=False)
        for t, kind in zip(tokens, types, strict=False)
        if kind == USER_DEFINED and tokenizer.token_to_id(t) is not None
    ]
    if user:
        tokenizer.add_tokens(user)


def _tokenizer_config(meta: dict[str, Any], tokens: list[str], add_bos: bool) -> dict[str, Any]:
    def token(key: str) -> str | None:
        index = meta.get(f"tokenizer.ggml.{key}")
        return tokens[index] if index is not None and 0 <= index < len(tokens) else None

    return {
        "bos_token": token("bos_token_id"),
        "eos_token": token("eos_token_id"),
        "unk_token": token("unknown_token_id"),
        "pad_token": token("padding_token_id"),
        "add_bos_token": add_bos,
        "chat_template": meta.get("tokenizer.chat_template"),
        # Fill-in-the-middle tokens, when the model has them (read by Tokenizer.from_folder).
        **{f"{part}_token": token(f"{part}_token_id") for part in FIM_PARTS},
    }


@lru_cache(maxsize=1)
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\u00a1"), ord("\u00ac") + 1))
        + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}
