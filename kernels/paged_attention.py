"""Attention over a paged KV cache, addressed on the device: block tables, lengths and the draft
tree's visibility bits are tensors, so nothing about a step's shape is read back to the host.

Inputs (one step, T packed query rows over B sequences, each feeding at most max_q rows):
    query          [T, Hq, D]       RoPE applied
    k_cache/v_cache [slots, Hkv, D] this layer's cache, the step's keys/values already written
    block_tables   [B, NB] int64    slot of a sequence's column c: table[c // bs] * bs + c % bs
    start          [B]              the sequence's cached tokens: its fed row j sits in column
                                    start + j
    context_lens   [B]              columns it may read: start + fed rows (0: a padding sequence)
    packed_index   [T]              b * max_q + j for packed row (b, j)
    first_node     [B], node_bits [T]
                                    a sequence's fed rows from first_node on are draft nodes; row
                                    j sees column c iff c < context_len and either c is before the
                                    first node's column and c <= start + j (causal), or c is node
                                    m's column and bit m of its node_bits is set (its ancestors
                                    and itself). A chain has first_node = its fed rows: causal.

`paged_attention` takes them (the one signature; the addressing travels on as `PagedRows`) and
runs one of two implementations: the plain PyTorch reference (a gather through the tables, one
masked SDPA, built on `visibility`, the relation above) or kernels/triton_paged_attention.py,
which computes the same per query row in one Triton program that walks the table itself: the
kernel a captured graph replays (its loop bounds are read on the device, so one graph serves
every context length of its bucket). A query row that sees nothing (padding) gets zeros.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

__all__ = ["PagedRows", "context_slots", "paged_attention", "paged_attention_reference",
           "visibility"]


class PagedRows(NamedTuple):
    """Where a step's packed query rows and their context lie in the paged cache (the module
    docstring's inputs but the query, the caches and the scale)."""

    block_tables: torch.Tensor  # [B, NB] int64
    block_size: int
    start: torch.Tensor  # [B]
    context_lens: torch.Tensor  # [B]
    packed_index: torch.Tensor  # [T]
    max_q: int
    first_node: torch.Tensor  # [B]
    node_bits: torch.Tensor  # [T]


def context_slots(block_tables: torch.Tensor, block_size: int) -> torch.Tensor:
    """[B, NB * bs]: the slot of every column of every sequence, through its table."""
    b, nb = block_tables.shape
    offs = torch.arange(block_size, device=block_tables.device)
    return (block_tables[:, :, None] * block_size + offs).reshape(b, nb * block_size)


def visibility(start: torch.Tensor, context_lens: torch.Tensor, first_node: torch.Tensor,
               node_bits: torch.Tensor, max_ctx: int) -> torch.Tensor:
    """bool [B, max_q, max_ctx] from start, context_lens, first_node [B] and node_bits
    [B, max_q] (see the module docstring)."""
    b, max_q = node_bits.shape
    dev = node_bits.device
    col = torch.arange(max_ctx, device=dev)[None, None, :]  # [1, 1, C]
    q_col = (start[:, None] + torch.arange(max_q, device=dev)[None, :])[:, :, None]  # [B, R, 1]
    first_col = (start + first_node)[:, None, None]  # [B, 1, 1]
    causal = (col < first_col) & (col <= q_col)
    node = (col - first_col).clamp(min=0, max=63)  # [B, 1, C]
    tree = (col >= first_col) & (((node_bits[:, :, None] >> node) & 1) != 0)
    return (causal | tree) & (col < context_lens[:, None, None])


def _reference(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               rows: PagedRows, scale: float) -> torch.Tensor:
    """[T, Hq, D] attention outputs (see the module docstring), in plain PyTorch."""
    block_tables, block_size, start, context_lens, packed_index, max_q, first_node, node_bits = rows
    t, hq, d = query.shape
    b, nb = block_tables.shape
    hkv = k_cache.shape[1]
    max_ctx = nb * block_size
    # queries and their bits padded to [B, max_q] (padding slots: zero queries, no bits)
    q = query.new_zeros(b * max_q, hq, d).index_copy_(0, packed_index, query)
    bits = node_bits.new_zeros(b * max_q).index_copy_(0, packed_index, node_bits)
    slots = context_slots(block_tables, block_size).reshape(-1)
    k = k_cache.index_select(0, slots).view(b, max_ctx, hkv, d).transpose(1, 2)
    v = v_cache.index_select(0, slots).view(b, max_ctx, hkv, d).transpose(1, 2)
    mask = visibility(start, context_lens, first_node, bits.view(b, max_q), max_ctx)
    seen = mask.any(-1, keepdim=True)  # [B, R, 1]: rows that see nothing give zeros
    mask = mask | ~seen & (torch.arange(max_ctx, device=mask.device) == 0)
    out = F.scaled_dot_product_attention(q.view(b, max_q, hq, d).transpose(1, 2),
                                         k.to(query.dtype), v.to(query.dtype),
                                         attn_mask=mask[:, None], scale=scale,
                                         enable_gqa=hkv != hq)  # [B, Hq, R, D]
    out = out * seen[:, None].to(out.dtype)
    return out.transpose(1, 2).reshape(b * max_q, hq, d).index_select(0, packed_index)


def paged_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, block_size: int, start: torch.Tensor,
                    context_lens: torch.Tensor, packed_index: torch.Tensor, max_q: int,
                    first_node: torch.Tensor, node_bits: torch.Tensor, scale: float,
                    impl: str = "auto") -> torch.Tensor:
    """[T, Hq, D] attention outputs (see the module docstring): the PyTorch reference, or on
    CUDA / MLU with Triton the Triton kernel (impl: "auto" | "reference" | "triton")."""
    from kernels.rejection import _use_triton

    rows = PagedRows(block_tables, block_size, start, context_lens, packed_index, max_q,
                     first_node, node_bits)
    if _use_triton(query.device, impl):
        from kernels.triton_paged_attention import paged_attention_triton

        return paged_attention_triton(query, k_cache, v_cache, rows, scale)
    return _reference(query, k_cache, v_cache, rows, scale)


def paged_attention_reference(*args, **kwargs) -> torch.Tensor:
    """`paged_attention` with the plain PyTorch implementation chosen: what the kernel is held
    to (the same arguments, impl aside)."""
    return paged_attention(*args, **kwargs, impl="reference")
