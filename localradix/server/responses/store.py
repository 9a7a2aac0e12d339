"""The responses kept for `previous_response_id` and `GET /v1/responses/{id}`: a bounded LRU in
the API process. It keeps what is needed to rebuild the next prompt (the conversation as chat
messages, this response's output included) and the prompt+output token ids whose KV the radix
cache may still hold; the KV itself is only ever in the cache."""

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
        self._kept: OrderedDict[str, StoredResponse] = OrderedDict()

    def get(self, response_id: str) -> StoredResponse | None:
        kept = self._kept.get(response_id)
        if kept is not None:
            self._kept.move_to_end(response_id)
        return kept

    def put(
        self,
        body: dict[str, Any],
        conversation: Sequence[dict[str, Any]],
        token_ids: Sequence[int],
    ) -> None:
        self._kept[body["id"]] = StoredResponse(body, tuple(conversation), array("q", token_ids))
        self._kept.move_to_end(body["id"])
        while len(self._kept) > self.capacity:
            self._kept.popitem(last=False)

    def pop(self, response_id: str) -> bool:
        return self._kept.pop(response_id, None) is not None

    def __len__(self) -> int:
        return len(self._kept)
