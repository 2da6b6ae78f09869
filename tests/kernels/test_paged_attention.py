"""Paged attention addressed on the device (kernels/paged_attention.py): the reference against
the definition computed row by row, and the Triton kernel (Triton's interpreter on the CPU)
against the reference: chains, trees, GQA, padding rows and sequences, ragged and uniform."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from kernels.paged_attention import paged_attention, paged_attention_reference, visibility

BS = 4  # block size


def _case(seed: int, lens_q, starts, trees=None, hq=4, hkv=2, d=16, nb=None, pad_seqs=0,
          uniform=False):
    """A random cache and a packed step. trees: per sequence None (a chain) or its node parents
    (nodes are its last fed rows). Returns the kwargs of paged_attention_reference."""
    g = torch.Generator().manual_seed(seed)
    b = len(lens_q) + pad_seqs
    max_q = max(lens_q)
    need = [-(-(s + q) // BS) for s, q in zip(starts, lens_q)]
    nb = nb or max(need)
    num_blocks = sum(need) + 2
    trash = num_blocks - 1
    perm = torch.randperm(num_blocks - 1, generator=g).tolist()  # scattered blocks
    tables = torch.full((b, nb), trash, dtype=torch.int64)
    at = 0
    for i, n in enumerate(need):
        tables[i, :n] = torch.tensor(perm[at:at + n])
        at += n
    k_cache = torch.randn(num_blocks * BS, hkv, d, generator=g)
    v_cache = torch.randn(num_blocks * BS, hkv, d, generator=g)
    first = []
    bits = []
    for q, tree in zip(lens_q, trees or [None] * len(lens_q)):
        if tree is None:
            first.append(q)
            bits.append([0] * q)
            continue
        n = len(tree)
        first.append(q - n)
        row_bits = [0] * (q - n)
        node_bits = []
        for m, p in enumerate(tree):
            node_bits.append((node_bits[p] if p >= 0 else 0) | (1 << m))
        bits.append(row_bits + node_bits)
    first += [max_q] * pad_seqs
    if uniform:  # b x max_q rows, padding rows included
        packed = torch.arange(b * max_q)
        bit_rows = [x for row in bits for x in row + [0] * (max_q - len(row))]
        bit_rows += [0] * (max_q * pad_seqs)
    else:
        packed = torch.tensor([i * max_q + j for i, q in enumerate(lens_q) for j in range(q)])
        bit_rows = [x for row in bits for x in row]
    t = packed.numel()
    query = torch.randn(t, hq, d, generator=g)
    return dict(query=query, k_cache=k_cache, v_cache=v_cache, block_tables=tables,
                block_size=BS, start=torch.tensor(list(starts) + [0] * pad_seqs),
                context_lens=torch.tensor([s + q for s, q in zip(starts, lens_q)]
                                          + [0] * pad_seqs),
                packed_index=packed, max_q=max_q, first_node=torch.tensor(first),
                node_bits=torch.tensor(bit_rows, dtype=torch.int64), scale=d ** -0.5)


def _definition(query, k_cache, v_cache, block_tables, block_size, start, context_lens,
                packed_index, max_q, first_node, node_bits, scale):
    """Row by row from the module docstring's words, no masks or padding tricks."""
    t, hq, d = query.shape
    groups = hq // k_cache.shape[1]
    out = torch.zeros_like(query)
    for r in range(t):
        b, j = divmod(int(packed_index[r]), max_q)
        s, ctx, fn = int(start[b]), int(context_lens[b]), int(first_node[b])
        cols = []
        for c in range(ctx):
            if c < s + fn:
                ok = c <= s + j
            else:
                ok = bool((int(node_bits[r]) >> (c - s - fn)) & 1)
            if ok:
                cols.append(c)
        if not cols:
            continue
        slots = [int(block_tables[b, c // block_size]) * block_size + c % block_size
                 for c in cols]
        for h in range(hq):
            k = k_cache[slots, h // groups]
            v = v_cache[slots, h // groups]
            w = torch.softmax(k @ query[r, h] * scale, dim=0)
            out[r, h] = w @ v
    return out


CASES = {
    "decode": dict(lens_q=[1, 1, 1], starts=[5, 0, 13]),
    "verify-chains": dict(lens_q=[4, 1, 6], starts=[7, 3, 0]),
    "prefill-and-decode": dict(lens_q=[9, 1, 3], starts=[0, 11, 4]),
    "trees": dict(lens_q=[5, 4, 1], starts=[6, 2, 9], trees=[[-1, -1, 0, 1], [-1, 0, 0], None]),
    "tree-after-chunk": dict(lens_q=[6], starts=[3], trees=[[-1, 0, -1]]),
    "uniform-padded": dict(lens_q=[3, 1], starts=[5, 10], trees=[[-1, -1], None],
                           pad_seqs=2, uniform=True, nb=6),
    "mha": dict(lens_q=[2, 3], starts=[4, 1], hq=2, hkv=2, d=8),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_is_the_definition(name):
    case = _case(hash(name) % 1000, **CASES[name])
    got = paged_attention_reference(**case)
    torch.testing.assert_close(got, _definition(**case), rtol=1e-5, atol=1e-5)


def test_visibility_of_a_tree():
    # one sequence, 2 cached columns, fed: root (row 0), nodes a (root's), b (root's), c (a's)
    mask = visibility(torch.tensor([2]), torch.tensor([6]), torch.tensor([1]),
                      torch.tensor([[0, 0b001, 0b010, 0b101]]), 6)[0]
    assert mask.int().tolist() == [
        [1, 1, 1, 0, 0, 0],  # root: cache + itself
        [1, 1, 1, 1, 0, 0],  # a: + a
        [1, 1, 1, 0, 1, 0],  # b: + b, not a
        [1, 1, 1, 1, 0, 1],  # c: + a and c
    ]


def test_trash_and_other_sequences_are_never_read():
    """Poisoning every slot a row may not see (the trash block, other sequences' blocks,
    columns past its context) leaves its output unchanged."""
    case = _case(7, lens_q=[3, 1], starts=[5, 6], trees=[[-1, -1], None], pad_seqs=1,
                 uniform=True, nb=5)
    clean = paged_attention_reference(**case)
    seen = set()
    for b in range(2):
        ctx = int(case["context_lens"][b])
        seen |= {int(case["block_tables"][b, c // BS]) * BS + c % BS for c in range(ctx)}
    poison = torch.ones(case["k_cache"].shape[0], dtype=torch.bool)
    poison[list(seen)] = False
    for name in ("k_cache", "v_cache"):
        case[name] = case[name].clone()
        case[name][poison] = 1e4
    dirty = paged_attention_reference(**case)
    real = torch.tensor([0, 1, 2, 3])  # sequence 0's rows, sequence 1's first row
    torch.testing.assert_close(dirty[real], clean[real])


needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="triton is not installed")


@needs_triton
@pytest.mark.parametrize("name", sorted(CASES))
def test_triton_equals_reference(name, monkeypatch):
    from triton_testlib import kernel_module, on

    # the kernel's module imported as impl="triton" will find it (interpreted on the CPU)
    _, device = kernel_module(monkeypatch, "kernels.triton_paged_attention")
    case = _case(hash(name) % 1000, **CASES[name])
    got = paged_attention(**on(device, case), impl="triton").cpu()
    torch.testing.assert_close(got, paged_attention_reference(**case), rtol=1e-4, atol=1e-4)


@needs_triton
def test_triton_long_context_crosses_chunks(monkeypatch):
    from triton_testlib import kernel_module, on

    # the kernel's module imported as impl="triton" will find it (interpreted on the CPU)
    _, device = kernel_module(monkeypatch, "kernels.triton_paged_attention")
    case = _case(3, lens_q=[2, 1], starts=[70, 33], d=64, hq=2, hkv=1)
    assert math.ceil(72 / 32) > 1  # more than one BLOCK_N chunk
    torch.testing.assert_close(paged_attention(**on(device, case), impl="triton").cpu(),
                               paged_attention_reference(**case), rtol=1e-4, atol=1e-4)
