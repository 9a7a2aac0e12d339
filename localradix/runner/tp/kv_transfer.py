"""TPKVTransfer: the KV of a tensor-parallel model's slots, every rank's heads, as host rows.

Each rank keeps the same slots with its own share of the KV heads (`model_api/shard.py`). A
token's row here is canonical: each group's K for every layer and every KV head in model order,
then its V, byte for byte what a tp=1 runner's `TorchKVTransfer` reads. So the cache tiers of
tp=1 and tp=2 of one model share a fingerprint and a disk folder. Reading gathers every rank's
rows at rank 0 and interleaves their heads (one copy of a head several ranks hold); writing
cuts each rank's heads out of the rows and scatters them. The workers take part through
`KVRead`/`KVWrite` messages on their control pipes, so a copy lands between the same steps on
every rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from localradix.model_api.shard import Shard
from localradix.runner.kv_transfer import TorchKVTransfer
from localradix.runner.tp.ranks import KVRead, KVWrite

if TYPE_CHECKING:
    from localradix.models.config import ModelConfig
    from localradix.runner.tp.dist import DistComm
    from localradix.runner.tp.ranks import WorkerRanks


@dataclass(frozen=True)
class HeadMap:
    """Which of the model's KV heads each rank holds (rank order), and where each model head
    is first found among all ranks' heads laid side by side."""

    ranks: tuple[tuple[int, ...], ...]
    total: int

    @classmethod
    def for_model(cls, config: ModelConfig, size: int) -> HeadMap:
        """Read off the shard's K projection rows, so the map is the weights' own split."""
        name = "model.layers.0.self_attn.k_proj.weight"
        ranks = []
        for rank in range(size):
            piece = Shard(rank, size).weight_slice(name, config)
            assert piece is not None and piece.dim == 0
            first, stop = piece.start // config.head_dim, piece.stop // config.head_dim
            ranks.append(tuple(range(first, stop)))
        return cls(tuple(ranks), config.num_key_value_heads)

    @property
    def first_holder(self) -> list[int]:
        """Per model head, its position among every rank's heads side by side."""
        flat = [head for heads in self.ranks for head in heads]
        return [flat.index(head) for head in range(self.total)]


def to_canonical(parts: Sequence[torch.Tensor], heads: HeadMap, layers: int) -> torch.Tensor:
    """Every rank's rows (uint8 [n, its bytes], rank order) -> canonical rows [n, bytes]."""
    n = parts[0].shape[0]
    split = [p.view(n, 2, layers, len(h), -1) for p, h in zip(parts, heads.ranks, strict=True)]
    index = torch.tensor(heads.first_holder, device=parts[0].device)
    return torch.cat(split, dim=3).index_select(3, index).reshape(n, -1)


def rank_part(rows: torch.Tensor, heads: HeadMap, rank: int, layers: int) -> torch.Tensor:
    """Rank `rank`'s rows (its heads only) of canonical `rows` (uint8 [n, bytes])."""
    n = rows.shape[0]
    index = torch.tensor(heads.ranks[rank], device=rows.device)
    return rows.view(n, 2, layers, heads.total, -1).index_select(3, index).reshape(n, -1)


class TPKVTransfer:
    """Rank 0's side of the copies: `local` is its own `TorchKVTransfer` (one group of K/V)."""

    def __init__(
        self, local: TorchKVTransfer, heads: HeadMap, comm: DistComm, ranks: WorkerRanks
    ) -> None:
        if len(local.groups) != 1:
            raise ValueError("tensor-parallel KV copies take one KV shape for every layer")
        self.local, self.heads, self.comm, self.ranks = local, heads, comm, ranks
        self.layers = local.groups[0][0].shape[0]
        self.bytes_per_token = local.bytes_per_token // len(heads.ranks[0]) * heads.total

    def read(self, slots: np.ndarray) -> np.ndarray:
        rows = to_canonical(self._gather(slots), self.heads, self.layers)
        return self.local.copies.to_host(rows).result()

    def read_ranks(self, slots: np.ndarray) -> list[np.ndarray]:
        """Each rank's own rows of `slots`, rank order (what `read` builds its rows from)."""
        return [part.cpu().numpy() for part in self._gather(slots)]

    def write(self, prefix: np.ndarray, slots: np.ndarray, parts: Sequence[np.ndarray]) -> None:
        done = 0
        for part in parts:  # chunk by chunk: no copy of a whole prompt's KV
            chunk = np.ascontiguousarray(slots[done : done + len(part)], dtype=np.int64)
            done += len(part)
            if not len(chunk):
                continue
            data = np.ascontiguousarray(part, dtype=np.uint8)
            rows = self.local.copies.to_device(data, self.local.device)
            pieces = [rank_part(rows, self.heads, r, self.layers) for r in range(self.comm.size)]
            self.ranks.send(KVWrite(chunk))  # the ranks join once rank 0 has every part
            self.local.put_rows(chunk, self.comm.scatter(pieces[0], pieces))

    def _gather(self, slots: np.ndarray) -> list[torch.Tensor]:
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        mine = self.local.rows(slots)  # first: a bad slot raises before any rank waits
        self.ranks.send(KVRead(slots))
        parts = self.comm.gather(mine)
        assert parts is not None  # rank 0 receives
        return parts


def serve_kv(message: KVRead | KVWrite, local: TorchKVTransfer, comm: DistComm) -> None:
    """A worker's side of one copy: send its rows of the slots, or take its part and write it."""
    if isinstance(message, KVRead):
        comm.gather(local.rows(message.slots))
        return
    out = torch.empty(
        len(message.slots), local.bytes_per_token, dtype=torch.uint8, device=local.device
    )
    local.put_rows(message.slots, comm.scatter(out))


def tp_kv_transfer(
    local: TorchKVTransfer | None, config: ModelConfig, comm: DistComm, ranks: WorkerRanks
) -> TPKVTransfer | None:
    """Rank 0's transfer, or None where its attention keeps no slot-indexed K/V tensors."""
    if local is None or len(local.groups) != 1:
        return None
    return TPKVTransfer(local, HeadMap.for_model(config, comm.size), comm, ranks)
