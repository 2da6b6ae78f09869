"""A KV cache shard that writes down what it does to its contents, and the replay of that
record on another shard: how rank 0 of a tensor-parallel verifier tells the other ranks which
blocks it zeroed and which kept rows it moved between two steps (verifier_service/tp/broadcast.py
sends the record with the step's plan; each rank replays it, in order, on its own shard).

    journal   (ZERO, n, block ids...) and (MOVE, n, sources..., destinations...), int64
"""

from __future__ import annotations

import numpy as np
import torch

from verifier_service.kv.cache import PagedKVCache

ZERO, MOVE = 1, 2


class JournaledKVCache(PagedKVCache):
    """Rank 0's KV cache shard: every operation on the cache's contents outside a step (zeroing
    blocks, moving kept rows) is also written down, for the next broadcast."""

    def __init__(self, *args, **kwargs):
        self._journal: list[np.ndarray] = []
        super().__init__(*args, **kwargs)
        self._journal.clear()  # the trash block: every rank zeroes its own

    def _zero(self, blocks: list[int]) -> None:
        self._journal.append(np.asarray([ZERO, len(blocks), *blocks], dtype=np.int64))
        super()._zero(blocks)

    def _move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        self._journal.append(np.concatenate([np.asarray([MOVE, len(src)], dtype=np.int64),
                                             src.numpy(), dst.numpy()]).astype(np.int64))
        super()._move(src, dst)

    def take_journal(self) -> np.ndarray:
        out = (np.concatenate(self._journal) if self._journal
               else np.zeros(0, dtype=np.int64))
        self._journal.clear()
        return out


def replay_journal(kv: PagedKVCache, journal: np.ndarray) -> None:
    """Repeat rank 0's cache operations on this rank's shard, in order."""
    at = 0
    while at < len(journal):
        op, n = int(journal[at]), int(journal[at + 1])
        if op == ZERO:
            kv._zero(journal[at + 2:at + 2 + n].tolist())
            at += 2 + n
        elif op == MOVE:
            src = torch.from_numpy(journal[at + 2:at + 2 + n].copy())
            dst = torch.from_numpy(journal[at + 2 + n:at + 2 + 2 * n].copy())
            kv._move(src, dst)
            at += 2 + 2 * n
        else:
            raise ValueError(f"unknown cache operation {op} in a step message")
