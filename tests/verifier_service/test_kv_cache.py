"""The paged KV cache on its own: the block allocator, addressing, and keeping the fed rows a
step accepted (a prefix, or rows moved within and across blocks) without leaking a block."""

from __future__ import annotations

import pytest
import torch

from verifier_service.kv.cache import (
    BlockAllocator,
    BlockTable,
    KVCacheSpec,
    OutOfBlocks,
    PagedKVCache,
)

BLOCK = 4


def _cache(num_blocks: int = 8) -> PagedKVCache:
    spec = KVCacheSpec(num_layers=2, num_kv_heads=1, head_dim=3, dtype=torch.float32,
                       block_size=BLOCK, num_blocks=num_blocks)
    kv = PagedKVCache(spec, torch.device("cpu"))
    kv.k.zero_()  # the cache is allocated uninitialised: NaN bits would defeat torch.equal
    kv.v.zero_()
    return kv


def _write(kv: PagedKVCache, table: BlockTable, start: int, values: list[float]) -> None:
    """A step feeding rows at positions start, start + 1, ...: row j's K is values[j] (V its
    negative) in every layer and head dimension."""
    slots = kv.slots(table, start, start + len(values))
    vals = torch.tensor(values, dtype=torch.float32)[:, None, None].expand(-1, 1, 3)
    for layer in range(kv.spec.num_layers):
        kv.k[layer, slots] = vals + layer
        kv.v[layer, slots] = -vals - layer


def _read(kv: PagedKVCache, table: BlockTable, n: int) -> list[float]:
    slots = kv.slots(table, 0, n)
    k, v = kv.k[:, slots, 0, 0], kv.v[:, slots, 0, 0]  # [layers, n]
    assert torch.equal(k[1] - 1, k[0]) and torch.equal(v, -k)  # every layer, K and V moved
    return k[0].tolist()


def test_allocator_hands_out_low_ids_and_takes_them_back():
    alloc = BlockAllocator(4)
    assert alloc.allocate(2) == [0, 1] and alloc.num_free == 2 and alloc.num_used == 2
    with pytest.raises(OutOfBlocks):
        alloc.allocate(3)
    assert alloc.num_free == 2  # a failed allocation takes nothing
    alloc.free([0, 1])
    assert alloc.allocate(4) == [0, 1, 2, 3]


def test_spec_sizes_blocks_from_memory():
    class Config:
        num_attention_heads, hidden_size, num_hidden_layers, num_key_value_heads = 4, 32, 2, 2

    spec = KVCacheSpec.for_model(Config, torch.float32, block_size=BLOCK, memory_bytes=4096)
    assert spec.bytes_per_token == 2 * 2 * 2 * 8 * 4  # K and V, layers, kv heads, head dim, fp32
    assert spec.num_blocks == 4096 // (spec.bytes_per_token * BLOCK)
    assert KVCacheSpec.for_model(Config, torch.float32, BLOCK, 4096, num_blocks=3).num_blocks == 3


def test_slots_address_positions_through_the_table():
    kv = _cache()
    other, table = BlockTable(), BlockTable()
    kv.reserve(other, 3)  # the sequence's blocks are not the first ones
    kv.reserve(table, 6)
    b0, b1 = table.blocks
    assert kv.slots(table, 2, 6).tolist() == [b0 * BLOCK + 2, b0 * BLOCK + 3, b1 * BLOCK,
                                              b1 * BLOCK + 1]
    assert kv.extra_blocks_needed(table, 9) == 1 and kv.can_reserve(table, 9)


def test_keeping_a_prefix_moves_nothing_and_frees_emptied_blocks():
    kv = _cache()
    table = BlockTable()
    kv.reserve(table, 10)  # 3 blocks: 6 cached positions + 4 fed rows
    _write(kv, table, 0, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    before = kv.k.clone()
    kv.keep(table, 6, [0, 1])  # a chain: its first two fed rows accepted
    assert torch.equal(kv.k, before)
    assert len(table) == 2 and kv.num_free_blocks == 6
    assert _read(kv, table, 8) == [0, 1, 2, 3, 4, 5, 6, 7]
    kv.reserve(table, 12)
    _write(kv, table, 8, [8, 90, 91, 92])
    kv.keep(table, 8, range(1))  # as the verify step names a chain's rows
    assert len(table) == 3 and kv.num_free_blocks == 5
    assert _read(kv, table, 9) == [0, 1, 2, 3, 4, 5, 6, 7, 8]


def test_keeping_rows_that_are_not_a_prefix_moves_them_across_blocks_and_leaks_nothing():
    kv = _cache()
    table = BlockTable()
    kv.reserve(table, 14)  # 4 blocks: 3 cached positions + 11 fed rows (positions 3..13)
    fed = [10.0 + j for j in range(11)]
    _write(kv, table, 0, [0.0, 1.0, 2.0])
    _write(kv, table, 3, fed)
    kept = [0, 2, 5, 9, 10]  # a tree's accepted path; rows 5, 9 and 10 sit in later blocks
    kv.keep(table, 3, kept)
    assert _read(kv, table, 8) == [0.0, 1.0, 2.0] + [fed[r] for r in kept]
    assert len(table) == kv.blocks_for(8) == 2 and kv.num_free_blocks == 6
    kv.release(table)
    assert kv.num_free_blocks == kv.num_blocks


def test_scratch_rows_between_kept_rows_leave_the_cache_as_if_never_fed():
    kv = _cache()
    plain, mixed = BlockTable(), BlockTable()
    kv.reserve(plain, 5)
    kv.reserve(mixed, 9)
    _write(kv, plain, 0, [1, 2, 3, 4, 5])
    _write(kv, mixed, 0, [1, 2, 3])
    _write(kv, mixed, 3, [4, 90, 91, 5, 92, 93])  # rows 1, 2, 4, 5: scratch
    kv.keep(mixed, 3, [0, 3])
    assert _read(kv, mixed, 5) == _read(kv, plain, 5)
    assert len(mixed) == len(plain) == 2


@pytest.mark.parametrize("rows", [[1, 1], [2, 0], [-1, 0]])
def test_kept_rows_must_be_fed_indices_in_order(rows):
    kv = _cache()
    table = BlockTable()
    kv.reserve(table, 4)
    with pytest.raises(ValueError, match="kept rows"):
        kv.keep(table, 0, rows)
    assert len(table) == 1  # refused: nothing freed or moved


def test_keeping_nothing_rolls_back_to_the_start():
    kv = _cache()
    table = BlockTable()
    kv.reserve(table, 9)
    kv.keep(table, 4, [])
    assert len(table) == 1 and kv.num_free_blocks == kv.num_blocks - 1


# -- the prefix cache's side of the allocator ------------------------------------------------


def _identity(kv: PagedKVCache) -> tuple[int, int, int]:
    held, cached_free, free = kv.allocator.accounting()
    assert held + cached_free + free == kv.num_blocks
    assert kv.num_free_blocks == cached_free + free
    return held, cached_free, free


def test_committed_blocks_outlive_their_table_and_are_shared_by_count():
    kv = _cache(8)
    a = BlockTable()
    kv.reserve(a, 10)  # 3 blocks, the last one partial
    assert kv.commit(a, [b"k0", b"k1", b"k2"], 10) == 2  # only full blocks of kept rows
    kv.release(a)
    assert _identity(kv) == (0, 2, 6)
    hits = kv.lookup([b"k0", b"k1", b"other"])
    assert len(hits) == 2 and kv.lookup([b"other", b"k1"]) == []  # from the first block only
    b, c = BlockTable(), BlockTable()
    for t in (b, c):
        assert kv.can_admit(t, 12, hits)
        kv.share(t, hits)
        kv.reserve(t, 12)
    assert b.blocks[:2] == c.blocks[:2] == hits and b.num_final == 2
    assert [kv.allocator.refs(x) for x in hits] == [2, 2]
    assert _identity(kv) == (4, 0, 4)
    with pytest.raises(ValueError):  # nothing writes into a shared block
        kv.keep(b, 7, range(1))
    kv.release(b)
    assert _identity(kv) == (3, 0, 5)  # still held by c
    kv.release(c)
    assert _identity(kv) == (0, 2, 6)


def test_eviction_takes_free_blocks_first_then_the_least_recently_used_tail_first():
    kv = _cache(4)
    a = BlockTable()
    kv.reserve(a, 12)
    kv.commit(a, [b"a0", b"a1", b"a2"], 12)
    kv.release(a)  # freed tail first: a2 is the oldest on the queue, a0 the youngest
    x = BlockTable()
    kv.reserve(x, 4)  # the one never-cached block
    assert kv.allocator.evictions == 0
    kv.reserve(x, 8)
    assert kv.allocator.evictions == 1 and len(kv.lookup([b"a0", b"a1", b"a2"])) == 2
    y = BlockTable()
    hits = kv.lookup([b"a0"])
    kv.share(y, hits)  # taken: no longer evictable
    kv.reserve(x, 12)  # evicts a1, never the held a0
    assert kv.lookup([b"a0", b"a1"]) == hits
    assert not kv.can_reserve(x, 16)  # nothing left: the held block is not free
    kv.release(x)
    kv.release(y)
    assert _identity(kv) == (0, 1, 3)


def test_admission_counts_idle_hits_out_of_the_free_blocks():
    kv = _cache(3)
    a = BlockTable()
    kv.reserve(a, 8)
    kv.commit(a, [b"a0", b"a1"], 8)
    kv.release(a)
    hits = kv.lookup([b"a0", b"a1"])
    assert kv.can_admit(BlockTable(), 12, hits)  # 2 hits + the 1 free block
    assert not kv.can_admit(BlockTable(), 16, hits)  # 2 more would evict its own hits
    assert kv.can_admit(BlockTable(), 12, [])  # without hits: evicting them is fine
