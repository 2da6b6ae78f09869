"""The paged KV cache: fixed-size blocks, a block allocator, per-sequence block tables.

Storage is one tensor per K and V, shaped [layers, num_blocks * block_size, kv_heads, head_dim]:
slot s of a sequence's position p is `table[p // block_size] * block_size + p % block_size`.
A sequence reserves slots for every token a step may write (its uncached tokens plus k drafts)
before the step, across block boundaries. After it, the engine names the fed rows to keep
(`keep`): they end at consecutive positions from the step's start (a chain keeps a prefix, so
nothing moves; a tree's accepted path, or rows around scratch rows, are moved within or across
blocks) and whole blocks left empty go back to the free list.

One block more than the allocator hands out is the *trash block*: padded steps (a bucket's
padding rows and sequences, verifier_service/step/plan.py) write their keys and values there and
attention reads it only for them, never as a real sequence's context.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch


class OutOfBlocks(RuntimeError):
    pass


@dataclass
class BlockTable:
    blocks: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.blocks)


class BlockAllocator:
    """A free list of block ids. Every block is either free or in exactly one table."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() hands out low ids first

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfBlocks(f"need {n} blocks, {len(self._free)} free")
        return [self._free.pop() for _ in range(n)]

    def free(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))


@dataclass(frozen=True)
class KVCacheSpec:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    block_size: int
    num_blocks: int

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype.itemsize

    @classmethod
    def for_model(cls, config, dtype: torch.dtype, block_size: int, memory_bytes: int,
                  num_blocks: int = 0, tensor_parallel_size: int = 1) -> "KVCacheSpec":
        """Blocks from a memory budget, unless num_blocks is given explicitly. Under tensor
        parallelism (splitspec/tensor_parallel.py) a rank holds its share of the KV heads, and
        the budget is each rank's: the same blocks (same ids) on every rank."""
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = (getattr(config, "num_key_value_heads", None) or heads) // tensor_parallel_size
        spec = cls(config.num_hidden_layers, kv_heads, head_dim, dtype, block_size, 1)
        n = num_blocks or max(1, memory_bytes // (spec.bytes_per_token * block_size))
        return cls(spec.num_layers, kv_heads, head_dim, dtype, block_size, int(n))


class PagedKVCache:
    def __init__(self, spec: KVCacheSpec, device: torch.device):
        self.spec = spec
        self.block_size = spec.block_size
        self.trash_block = spec.num_blocks  # never allocated: padding rows' keys and values
        slots = (spec.num_blocks + 1) * spec.block_size
        shape = (spec.num_layers, slots, spec.num_kv_heads, spec.head_dim)
        self.k = torch.empty(shape, dtype=spec.dtype, device=device)
        self.v = torch.empty(shape, dtype=spec.dtype, device=device)
        self.allocator = BlockAllocator(spec.num_blocks)
        # Attention multiplies the values of the columns it masks out by zero: a block's unused
        # slots must hold numbers, never NaN bits of uninitialised memory. Blocks are zeroed
        # when handed out; the trash block once, here.
        self._zero([self.trash_block])

    # -- accounting -------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return self.spec.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def extra_blocks_needed(self, table: BlockTable, num_tokens: int) -> int:
        return max(0, self.blocks_for(num_tokens) - len(table))

    def can_reserve(self, table: BlockTable, num_tokens: int) -> bool:
        return self.extra_blocks_needed(table, num_tokens) <= self.allocator.num_free

    def reserve(self, table: BlockTable, num_tokens: int) -> None:
        """Make room for positions [0, num_tokens). Raises OutOfBlocks, allocating nothing."""
        new = self.allocator.allocate(self.extra_blocks_needed(table, num_tokens))
        if new:
            self._zero(new)
            table.blocks.extend(new)

    def truncate(self, table: BlockTable, num_tokens: int) -> None:
        """Keep positions [0, num_tokens); blocks left empty go back to the free list."""
        keep = self.blocks_for(num_tokens)
        if keep < len(table.blocks):
            self.allocator.free(table.blocks[keep:])
            del table.blocks[keep:]

    def keep(self, table: BlockTable, start: int, rows: Sequence[int]) -> None:
        """After a step that fed rows at positions start, start + 1, ...: keep the fed rows
        `rows` (strictly increasing fed indices; a chain's: range(n)) at positions
        start .. start + len(rows) - 1 and drop every other fed row (rejected drafts, other
        branches, scratch rows)."""
        n = len(rows)
        if isinstance(rows, range) and rows.start == 0 and rows.step == 1:
            return self.truncate(table, start + n)  # a prefix (a chain, a prompt): no move
        if any(b <= a for a, b in zip(rows, rows[1:])) or (rows and rows[0] < 0):
            raise ValueError(f"kept rows must be distinct fed indices in order, got {rows}")
        if n and rows[-1] != n - 1:  # not a prefix: move each kept row down to its place
            moved = [(i, r) for i, r in enumerate(rows) if r != i]
            src = self.slots(table, start, start + rows[-1] + 1)[[r for _, r in moved]]
            dst = self.slots(table, start, start + n)[[i for i, _ in moved]]
            self._move(src, dst)
        self.truncate(table, start + n)

    def _move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy the slots src into the slots dst in K and V (host index tensors)."""
        src, dst = (self._on_device(x) for x in (src, dst))
        # gather first, then write: a destination may be another kept row's source
        self.k.index_copy_(1, dst, self.k.index_select(1, src))
        self.v.index_copy_(1, dst, self.v.index_select(1, src))

    def _zero(self, blocks: list[int]) -> None:
        """Zero the slots of `blocks` in K and V (no wait on the device)."""
        slots = (torch.tensor(blocks, dtype=torch.long)[:, None] * self.block_size
                 + torch.arange(self.block_size)).reshape(-1)
        slots = self._on_device(slots)
        self.k.index_fill_(1, slots, 0)
        self.v.index_fill_(1, slots, 0)

    def _on_device(self, index: torch.Tensor) -> torch.Tensor:
        """A host index tensor on the cache's device, copied without waiting for the device
        (pinned source, non-blocking copy: ordered after the step that wrote the rows)."""
        device = self.k.device
        if device.type == "cpu":
            return index
        if device.type in ("cuda", "mlu"):
            index = index.pin_memory()
        return index.to(device, non_blocking=True)

    def release(self, table: BlockTable) -> None:
        self.truncate(table, 0)

    # -- addressing ---------------------------------------------------------------------------

    def slots(self, table: BlockTable, start: int, end: int) -> torch.Tensor:
        """Slot ids of positions [start, end) of a sequence: int64 [end - start] (CPU)."""
        pos = torch.arange(start, end)
        blocks = torch.tensor(table.blocks, dtype=torch.long)[pos // self.block_size]
        return blocks * self.block_size + pos % self.block_size
