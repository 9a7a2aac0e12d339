"""Tokenizers: the chat-template and prompt rules they share, and the `tokenizers`-backed one
(`tokenizer_choice.load_tokenizer` picks which tokenizer a model gets).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as Backend

from localradix.loader.chat_template import render_chat_template, select_template

# A GGUF's `tokenizer.ggml.fim_*_token_id` as tokenizer_config keys (gguf_tokenizer.py).
FIM_TOKEN_KEYS = tuple(f"fim_{p}_token" for p in ("pre", "suf", "mid", "pad", "rep", "sep"))


class ChatTokenizer(ABC):
    """What every tokenizer shares: the chat template and how a prompt gets its BOS. The rest
    of the code uses tokenizers by this surface (encode, decode, eos_token_ids, ...)."""

    chat_template: str | None
    special_tokens: dict[str, str]
    eos_token_ids: tuple[int, ...]

    @property
    @abstractmethod
    def bos_token_id(self) -> int | None: ...

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @abstractmethod
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

    @abstractmethod
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    @abstractmethod
    def piece_bytes(self, token_id: int) -> bytes:
        """One token's text as bytes (special tokens spelled out)."""

    @abstractmethod
    def token_to_id(self, token: str) -> int | None: ...

    def encode_batch(
        self, texts: Sequence[str], add_special_tokens: bool = False
    ) -> list[list[int]]:
        return [self.encode(text, add_special_tokens) for text in texts]

    def encode_prompt(self, text: str) -> list[int]:
        """The ids a model sees for a prompt: BOS (and EOS) where the tokenizer's own rule adds
        them, and never a second BOS where the text (a chat template's output) already has one."""
        ids = self.encode(text, add_special_tokens=True)
        bos = self.bos_token_id
        if bos is not None and len(ids) >= 2 and ids[0] == bos == ids[1]:
            return ids[1:]
        return ids

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """Render the conversation to a prompt string (tokenize it with `encode`)."""
        if self.chat_template is None:
            raise ValueError(
                "this model has no chat template; use the completions API with a raw prompt"
            )
        context = {**self.special_tokens, **kwargs}
        return render_chat_template(
            self.chat_template,
            messages=messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            **context,
        )


class Tokenizer(ChatTokenizer):
    """A `tokenizers` backend plus special tokens and the chat template."""

    def __init__(
        self,
        backend: Backend,
        *,
        chat_template: str | None = None,
        special_tokens: dict[str, str | None] | None = None,
        eos_token_ids: Iterable[int] = (),
    ) -> None:
        self.backend = backend
        self.chat_template = chat_template
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        eos = list(eos_token_ids)
        eos_token = self.special_tokens.get("eos_token")
        eos_id = None if eos_token is None else backend.token_to_id(eos_token)
        if eos_id is not None:
            eos.insert(0, eos_id)
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(eos))  # ordered, unique

    @property
    def bos_token_id(self) -> int | None:
        token = self.special_tokens.get("bos_token")
        return None if token is None else self.backend.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def piece_bytes(self, token_id: int) -> bytes:
        """One token's text as bytes (special tokens spelled out)."""
        return self.backend.decode([int(token_id)], skip_special_tokens=False).encode("utf-8")

    def encode_batch(
        self, texts: Sequence[str], add_special_tokens: bool = False
    ) -> list[list[int]]:
        encodings = self.backend.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        return [e.ids for e in encodings]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str | None]:
        return [self.backend.id_to_token(int(i)) for i in ids]

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    @staticmethod
    def from_folder(folder: str | Path) -> Tokenizer:
        """An HF-layout folder: tokenizer.json, tokenizer_config.json, chat_template.jinja, ..."""
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"{folder} has no tokenizer.json (only fast tokenizers are supported)"
            )
        config = _read_json(folder / "tokenizer_config.json")
        template = select_template(config.get("chat_template"))
        jinja = folder / "chat_template.jinja"
        if jinja.is_file():
            template = jinja.read_text(encoding="utf-8")
        elif template is None and (folder / "chat_template.json").is_file():
            template = select_template(
                _read_json(folder / "chat_template.json").get("chat_template")
            )
        specials = {
            name: _token_text(config.get(name))
            for name in ("bos_token", "eos_token", "unk_token", "pad_token", *FIM_TOKEN_KEYS)
        }
        eos_ids = _ids(_read_json(folder / "generation_config.json").get("eos_token_id"))
        eos_ids += _ids(_read_json(folder / "config.json").get("eos_token_id"))
        return Tokenizer(
            Backend.from_file(str(path)),
            chat_template=template,
            special_tokens=specials,
            eos_token_ids=eos_ids,
        )


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _token_text(value: Any) -> str | None:
    """Special tokens are a string, or an AddedToken dict with `content`."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]
