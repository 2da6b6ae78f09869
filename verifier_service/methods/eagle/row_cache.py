"""The EAGLE head's share of prefix caching: its own keys and values for the positions of a
cached target block, kept so that a request reusing the target's blocks need not run the target
over them again to give the head their features.

The head's row at position i is computed from the target's features at i and the token at
i + 1, so its rows for target block b depend on the first token of block b + 1 too. They are
kept under the prefix key of block b + 1 (verifier_service/kv/prefix.py), which names every
token up to the end of that block. A request whose first h target blocks are cached can
therefore restore the head's rows for at most h - 1 of them from their successors' keys (vLLM,
whose EAGLE heads keep their rows in the target's paged cache, drops the last matched block for
the same reason); the target computes the rest, and the head learns them from its features as
on any prefill.

Bounded: at most `capacity` blocks of rows, least recently used evicted first. A block of rows
is one layer's keys and values for block_size positions: 1 / num_layers of a target block.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import torch


class HeadRowCache:
    def __init__(self, block_size: int, capacity: int):
        self.block_size = block_size
        self.capacity = capacity
        self._rows: OrderedDict[bytes, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._rows)

    def reusable(self, keys: Sequence[bytes]) -> int:
        """How many leading blocks of a prompt with these target block keys the head can take
        its rows for: block b needs keys[b + 1] kept."""
        n = 0
        while n + 1 < len(keys) and keys[n + 1] in self._rows:
            n += 1
        return n

    def put(self, next_key: bytes, keys: torch.Tensor, values: torch.Tensor) -> None:
        """The head's rows of one block ([1, Hkv, block_size, D] each, copied), kept under the
        key of the block after it."""
        if next_key in self._rows:
            self._rows.move_to_end(next_key)
            return
        self._rows[next_key] = (keys.clone(), values.clone())
        while len(self._rows) > self.capacity:
            self._rows.popitem(last=False)
            self.evictions += 1

    def restore(self, keys: Sequence[bytes], num_blocks: int, into_keys: torch.Tensor,
                into_values: torch.Tensor) -> bool:
        """Write the rows of blocks 0 .. num_blocks - 1 into a sequence's buffers
        ([1, Hkv, capacity, D]); False (nothing written) when one is no longer kept."""
        got = [self._rows.get(keys[b + 1]) for b in range(num_blocks)]
        if any(g is None for g in got):
            return False
        bs = self.block_size
        for b, (k, v) in enumerate(got):
            self._rows.move_to_end(keys[b + 1])
            into_keys[:, :, b * bs:(b + 1) * bs] = k
            into_values[:, :, b * bs:(b + 1) * bs] = v
        return True
