"""The paged KV cache: fixed-size blocks, a block allocator, per-sequence block tables.

Storage is one tensor per K and V, shaped [layers, num_blocks * block_size, kv_heads, head_dim]:
slot s of a sequence's position p is `table[p // block_size] * block_size + p % block_size`.
A sequence reserves slots for every token a step may write (its uncached tokens plus k drafts)
before the step, across block boundaries. After it, the engine names the fed rows to keep
(`keep`): they end at consecutive positions from the step's start (a chain keeps a prefix, so
nothing moves; a tree's accepted path, or rows around scratch rows, are moved within or across
blocks) and whole blocks left empty go back to the free list.

Full blocks whose rows are all kept (final) are offered to the prefix cache under a key that
names the whole prefix (verifier_service/kv/prefix.py); a later request whose prompt starts
with the same blocks takes them instead of computing them (`lookup`, `share`). A shared block
is read-only: a sequence writes only from its own first non-final block on (`keep` refuses
anything else), so a rollback never touches one.

One block more than the allocator hands out is the *trash block*: padded steps (a bucket's
padding rows and sequences, verifier_service/step/plan.py) write their keys and values there and
attention reads it only for them, never as a real sequence's context.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

import torch


class OutOfBlocks(RuntimeError):
    pass


@dataclass
class BlockTable:
    blocks: list[int] = field(default_factory=list)
    # leading blocks whose contents are final: taken from the prefix cache, or full of kept
    # rows and offered to it (`PagedKVCache.commit`). Nothing writes into them again.
    num_final: int = 0

    def __len__(self) -> int:
        return len(self.blocks)


class BlockAllocator:
    """Block ids and who holds them. Every block is in exactly one of three states:

        held         in one or more block tables (a reference count each; only a block of
                     the prefix cache is ever in more than one)
        cached free  its contents named by a prefix key (verifier_service/kv/prefix.py) and
                     held by no table: on a least-recently-used queue, reused by a request
                     whose prompt starts the same way, evicted only when an allocation needs it
        free         nothing in it anyone wants

    so held + cached free + free = all blocks (`accounting`). An allocation takes free blocks
    first, then evicts cached free ones, oldest first: caching never makes a request wait."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() hands out low ids first
        self._lru: OrderedDict[int, None] = OrderedDict()  # cached free: oldest first
        self._refs = [0] * num_blocks
        self._key_of: dict[int, bytes] = {}
        self._block_of: dict[bytes, int] = {}
        self.evictions = 0  # cached blocks whose contents were dropped for an allocation

    @property
    def num_free(self) -> int:
        """Blocks an allocation can have: free and cached free."""
        return len(self._free) + len(self._lru)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def num_cached(self) -> int:
        """Blocks whose contents the prefix cache names (held or not)."""
        return len(self._key_of)

    def accounting(self) -> tuple[int, int, int]:
        """(held, cached free, free): they add up to num_blocks."""
        held = sum(1 for r in self._refs if r > 0)
        return held, len(self._lru), len(self._free)

    def refs(self, block: int) -> int:
        return self._refs[block]

    def allocate(self, n: int) -> list[int]:
        if n > self.num_free:
            raise OutOfBlocks(f"need {n} blocks, {self.num_free} free")
        out = []
        for _ in range(n):
            if self._free:
                block = self._free.pop()
            else:  # evict the least recently used cached block
                block, _ = self._lru.popitem(last=False)
                del self._block_of[self._key_of.pop(block)]
                self.evictions += 1
            self._refs[block] = 1
            out.append(block)
        return out

    def free(self, blocks: list[int]) -> None:
        """Drop one reference to each block; a block no table holds any more stays cached
        when it has a key. The last block goes first, so a sequence's tail is evicted
        before its head (the head is what other prompts share)."""
        for block in reversed(blocks):
            if self._refs[block] <= 0:
                raise RuntimeError(f"block {block} freed more often than it was handed out")
            self._refs[block] -= 1
            if self._refs[block]:
                continue
            if block in self._key_of:
                self._lru[block] = None
            else:
                self._free.append(block)

    # -- the prefix cache ----------------------------------------------------------------------

    def lookup(self, keys: Sequence[bytes]) -> list[int]:
        """The cached blocks of the longest run of `keys` from the first."""
        out = []
        for key in keys:
            block = self._block_of.get(key)
            if block is None:
                break
            out.append(block)
        return out

    def acquire(self, blocks: Sequence[int]) -> None:
        """One more reference to each cached block (taking it off the queue if no table held
        it)."""
        for block in blocks:
            if block not in self._key_of:
                raise RuntimeError(f"block {block} is not in the prefix cache")
            if self._refs[block] == 0:
                del self._lru[block]
            self._refs[block] += 1

    def cache(self, block: int, key: bytes) -> bool:
        """Name a held block's (final) contents by `key`; False when another block already
        has that key (the duplicate stays private and is freed as usual)."""
        if self._refs[block] <= 0:
            raise RuntimeError(f"block {block} is not held: only a table's block is cached")
        if key in self._block_of or block in self._key_of:
            return False
        self._key_of[block] = key
        self._block_of[key] = block
        return True


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
        """Blocks an allocation can have (cached ones that no table holds among them)."""
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
        """Keep positions [0, num_tokens); blocks left empty go back to the allocator."""
        keep = self.blocks_for(num_tokens)
        if keep < table.num_final:
            if keep:  # only a release (to 0) may drop final blocks
                raise ValueError(f"truncating to {num_tokens} tokens would drop final blocks")
            table.num_final = 0
        if keep < len(table.blocks):
            self.allocator.free(table.blocks[keep:])
            del table.blocks[keep:]

    # -- the prefix cache ------------------------------------------------------------------------

    def lookup(self, keys: Sequence[bytes]) -> list[int]:
        """The cached blocks of the longest run of `keys` (verifier_service/kv/prefix.py)."""
        return self.allocator.lookup(keys)

    def can_admit(self, table: BlockTable, num_tokens: int, hits: Sequence[int]) -> bool:
        """Whether an empty table can take the cached blocks `hits` and reserve the rest of
        positions [0, num_tokens): the hits that no table holds leave the free count."""
        idle = sum(1 for b in hits if self.allocator.refs(b) == 0)
        return self.blocks_for(num_tokens) - len(hits) <= self.allocator.num_free - idle

    def share(self, table: BlockTable, hits: Sequence[int]) -> None:
        """An empty table starts with the cached blocks `hits` (read-only to it)."""
        if table.blocks:
            raise ValueError("cached blocks start a table: this one already has blocks")
        self.allocator.acquire(hits)
        table.blocks.extend(hits)
        table.num_final = len(hits)

    def commit(self, table: BlockTable, keys: Sequence[bytes], num_tokens: int) -> int:
        """Offer the table's full blocks within positions [0, num_tokens), whose keys and
        values are final (kept rows only: never a draft row still to be verified), to the
        prefix cache under `keys` (one per block, at least that many); returns how many
        blocks are final now."""
        final = min(num_tokens // self.block_size, len(keys), len(table.blocks))
        for i in range(table.num_final, final):
            self.allocator.cache(table.blocks[i], keys[i])
        table.num_final = max(table.num_final, final)
        return table.num_final

    def keep(self, table: BlockTable, start: int, rows: Sequence[int]) -> None:
        """After a step that fed rows at positions start, start + 1, ...: keep the fed rows
        `rows` (strictly increasing fed indices; a chain's: range(n)) at positions
        start .. start + len(rows) - 1 and drop every other fed row (rejected drafts, other
        branches, scratch rows)."""
        n = len(rows)
        if start < table.num_final * self.block_size:
            raise ValueError(f"rows kept from position {start} would overwrite a final block "
                             f"(the table's first {table.num_final} are)")
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
