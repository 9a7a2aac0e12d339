"""LlamaVocabTokenizer: a GGUF tokenized by llama.cpp's own vocabulary code, exactly.

Only the vocabulary is loaded (`vocab_only`: no tensors; 0.4 s for a 152k vocab). Text is
tokenized as llama-server tokenizes prompts (`parse_special`, so a chat template's
`<|im_start|>` is the special token) and ids are decoded as llama-server streams them: the raw
bytes of each token's piece, joined, so an incomplete UTF-8 tail shows as U+FFFD for the
incremental detokenizer to hold back. The C functions are called directly: llama-cpp-python's
`Llama.detokenize` drops pieces longer than 32 bytes.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from localradix.loader.tokenizer import FIM_TOKEN_KEYS, ChatTokenizer
from localradix.store.source import ModelSourceError

PIECE_BUFFER = 64  # bytes; longer pieces are fetched again with the size llama.cpp asks for
# Special ids a GGUF may name, under the keys the chat templates and FIM code read.
SPECIAL_IDS = {
    "bos_token": "llama_vocab_bos",
    "eos_token": "llama_vocab_eos",
    **{key: "llama_vocab_" + key.removesuffix("_token") for key in FIM_TOKEN_KEYS},
}


class LlamaVocabTokenizer(ChatTokenizer):
    """The tokenizer surface of `loader.tokenizer.Tokenizer`, on llama.cpp's vocabulary."""

    def __init__(self, path: str | Path) -> None:
        self._llama = _llama_module()
        self._model = _load_vocab(self._llama, Path(path))
        self._vocab_ptr = self._llama.llama_model_get_vocab(self._model)
        self._n_tokens = int(self._llama.llama_vocab_n_tokens(self._vocab))
        self._pieces: tuple[dict[int, bytes], dict[int, bytes]] = ({}, {})  # by `special`
        self.chat_template = _chat_template(self._llama, self._model)
        self.eos_token_ids = self._eog_ids()
        self.special_tokens = self._special_tokens()

    # ---- the shared surface ------------------------------------------------------------

    @property
    def bos_token_id(self) -> int | None:
        return _id_or_none(self._llama.llama_vocab_bos(self._vocab))

    @property
    def vocab_size(self) -> int:
        return self._n_tokens

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.tokenize(text, add_special=add_special_tokens, parse_special=True)

    def encode_prompt(self, text: str) -> list[int]:
        """As every tokenizer does, but a BOS the text starts with is cut from the text first
        (as llama-server does), so llama.cpp does not warn about two BOS on every request."""
        bos = self.special_tokens.get("bos_token")
        if bos and self.add_bos and text.startswith(bos):
            text = text[len(bos) :]
        return super().encode_prompt(text)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        pieces = (self._piece(int(i), not skip_special_tokens) for i in ids)
        return b"".join(pieces).decode("utf-8", errors="replace")

    def piece_bytes(self, token_id: int) -> bytes:
        return self._piece(int(token_id), special=True)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[bytes]:
        """Raw piece bytes for xgrammar's RAW vocabulary; b"" for end-of-generation tokens,
        which xgrammar then treats as special (a grammar ends with them, never spells them).
        Control tokens keep their text, as a Hugging Face vocabulary gives it: a forced call's
        markers (harmony's <|channel|>, DeepSeek's call tokens) are then the model's own
        single tokens, not the same text spelled out in pieces it never writes."""
        stops = set(self.eos_token_ids)
        return [b"" if int(i) in stops else self._piece(int(i), special=True) for i in ids]

    def token_to_id(self, token: str) -> int | None:
        """The id of the one token whose text is exactly `token`, else None."""
        ids = self.tokenize(token, add_special=False, parse_special=True)
        if len(ids) == 1 and self.piece_bytes(ids[0]) == token.encode("utf-8"):
            return ids[0]
        return None

    # ---- llama.cpp's own calls ---------------------------------------------------------

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        """llama_tokenize as is (thread-safe): `add_special` adds BOS/EOS where the vocabulary
        says so; `parse_special` matches control tokens' text."""
        data = text.encode("utf-8")
        size = len(data) + 8  # a token covers a byte or more, plus the added specials
        for _ in range(2):
            out = (self._llama.llama_token * size)()
            n = self._llama.llama_tokenize(
                self._vocab, data, len(data), out, size, add_special, parse_special
            )
            if n >= 0:
                return list(out[:n])
            size = -n
        raise RuntimeError(f"llama_tokenize kept asking for a bigger buffer ({size})")

    @property
    def add_bos(self) -> bool:
        return bool(self._llama.llama_vocab_get_add_bos(self._vocab))

    @property
    def add_eos(self) -> bool:
        return bool(self._llama.llama_vocab_get_add_eos(self._vocab))

    def close(self) -> None:
        """Free llama.cpp's model (the vocabulary); the tokenizer is unusable after."""
        model, self._model = getattr(self, "_model", None), None
        if model is not None:
            self._llama.llama_model_free(model)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the bindings may be half torn down
            pass

    # ---- internals ---------------------------------------------------------------------

    @property
    def _vocab(self) -> Any:
        """The C vocabulary; an error once closed (llama.cpp would read freed memory)."""
        if self._model is None:
            raise ValueError("this tokenizer is closed")
        return self._vocab_ptr

    def _piece(self, token_id: int, special: bool) -> bytes:
        """The piece llama-server streams (no lstrip); b"" for an id outside the vocabulary
        (llama.cpp would abort on it)."""
        cache = self._pieces[special]
        piece = cache.get(token_id)
        if piece is None:
            inside = 0 <= token_id < self._n_tokens
            piece = self._token_to_piece(token_id, special) if inside else b""
            cache[token_id] = piece
        return piece

    def _token_to_piece(self, token_id: int, special: bool) -> bytes:
        size = PIECE_BUFFER
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = self._llama.llama_token_to_piece(self._vocab, token_id, buf, size, 0, special)
            if n >= 0:
                return buf.raw[:n]
            size = -n
        raise RuntimeError(f"llama_token_to_piece kept asking for a bigger buffer ({size})")

    def _eog_ids(self) -> tuple[int, ...]:
        """Every end-of-generation id (EOS, EOT, EOM, FIM pad/rep/sep, ...), EOS first."""
        is_eog = self._llama.llama_vocab_is_eog
        eog = [i for i in range(self._n_tokens) if is_eog(self._vocab, i)]
        eos = _id_or_none(self._llama.llama_vocab_eos(self._vocab))
        first = [eos] if eos is not None else []
        return tuple(dict.fromkeys(first + eog))

    def _special_tokens(self) -> dict[str, str]:
        specials = {}
        for key, function in SPECIAL_IDS.items():
            token_id = _id_or_none(getattr(self._llama, function)(self._vocab))
            if token_id is not None:
                specials[key] = self.piece_bytes(token_id).decode("utf-8", errors="replace")
        return specials


def _llama_module() -> Any:
    """llama_cpp's C bindings, imported as the runner imports them, with llama.cpp's log
    quiet unless someone (the runner at --log-level debug) already chose a level."""
    from localradix.loader.llama_openmp import settle_openmp

    settle_openmp()
    import llama_cpp.llama_cpp as llama

    log = logging.getLogger("llama-cpp-python")
    if log.level == logging.NOTSET:
        log.setLevel(logging.ERROR)
    llama.llama_backend_init()
    return llama


def _load_vocab(llama: Any, path: Path) -> Any:
    params = llama.llama_model_default_params()
    params.vocab_only = True
    model = llama.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise ModelSourceError(
            f"llama.cpp could not load the vocabulary of {path}: not a GGUF, or one newer than "
            "this llama-cpp-python (pip install -U llama-cpp-python)"
        )
    return model


def _chat_template(llama: Any, model: Any) -> str | None:
    template = llama.llama_model_chat_template(model, None)
    return None if template is None else template.decode("utf-8")


def _id_or_none(token_id: int) -> int | None:
    return None if token_id < 0 else int(token_id)
