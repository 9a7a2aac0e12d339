"""The responses kept for `previous_response_id` and `GET /v1/responses/{id}`: a bounded LRU in
the API process. It keeps what is needed to rebuild the next prompt (the conversation as chat
messages, this response's output included) and the prompt+output token ids whose KV the radix
cache may still hold; the KV itself is only ever in the cache. With API keys on, a response is
kept for the key that made it (a digest of it, `owner`): another key's caller cannot read,
continue or delete it, and learns only that no such response is kept."""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

CAPACITY = 1024


@dataclass(frozen=True)
class StoredResponse:
    body: dict[str, Any]  # the response object as it was returned
    conversation: tuple[dict[str, Any], ...]  # chat messages, without the instructions
    token_ids: array  # prompt + output: what the radix cache may serve again


class ResponseStore:
    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._kept: OrderedDict[tuple[str | None, str], StoredResponse] = OrderedDict()

    def get(self, response_id: str, owner: str | None = None) -> StoredResponse | None:
        kept = self._kept.get((owner, response_id))
        if kept is not None:
            self._kept.move_to_end((owner, response_id))
        return kept

    def put(
        self,
        body: dict[str, Any],
        conversation: Sequence[dict[str, Any]],
        token_ids: Sequence[int],
        owner: str | None = None,
    ) -> None:
        key = (owner, body["id"])
        self._kept[key] = StoredResponse(body, tuple(conversation), array("q", token_ids))
        self._kept.move_to_end(key)
        while len(self._kept) > self.capacity:
            self._kept.popitem(last=False)

    def pop(self, response_id: str, owner: str | None = None) -> bool:
        return self._kept.pop((owner, response_id), None) is not None

    def __len__(self) -> int:
        return len(self._kept)
