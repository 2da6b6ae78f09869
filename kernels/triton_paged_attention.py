"""Triton paged attention: one program per (query row, query head), walking its sequence's block
table on the device. Same inputs and result as kernels.paged_attention.paged_attention_reference:
kernels.paged_attention.paged_attention(..., impl="triton") calls it.

Program (t, h): the row's sequence b = packed_index[t] // max_q and fed index j; it reads keys
and values of columns 0 .. context_lens[b] - 1 in BLOCK_N chunks through block_tables[b] (the
loop bound is loaded, not a shape: a graph captured once serves every context length), keeps the
columns `visibility` allows (causal before the first draft node, node_bits after it), and
accumulates softmax(q.k * scale) v online in float32. GQA: head h reads KV head h // (Hq / Hkv).
A row that sees no column writes zeros.

Used on CUDA (and on MLU with Cambricon's Triton) by kernels.paged_attention.paged_attention;
tested on the CPU through Triton's interpreter (TRITON_INTERPRET=1, read when this module is
imported) against the reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["paged_attention_triton"]


# Integers that change from step to step are not specialized on (Triton compiles a variant per
# value that is 1 or a multiple of 16): the rows per sequence and the block table's width would
# otherwise compile new variants while serving, a fraction of a second each.
@triton.jit(do_not_specialize=["stride_bt", "MAX_Q"])
def _paged_attention_kernel(
    q_ptr, stride_qt, stride_qh,  # query [T, Hq, D]
    k_ptr, v_ptr, stride_ks, stride_kh,  # caches [slots, Hkv, D] (same strides)
    bt_ptr, stride_bt,  # block_tables [B, NB]
    start_ptr, ctx_ptr, first_ptr,  # [B] each
    packed_ptr, bits_ptr,  # [T] each
    out_ptr, stride_ot, stride_oh,  # out [T, Hq, D]
    scale, MAX_Q, GROUPS, D,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    packed = tl.load(packed_ptr + t)
    b = packed // MAX_Q
    j = packed - b * MAX_Q
    start = tl.load(start_ptr + b)
    ctx = tl.load(ctx_ptr + b)
    first_col = start + tl.load(first_ptr + b)
    q_col = start + j
    bits = tl.load(bits_ptr + t)
    kvh = h // GROUPS

    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    q = tl.load(q_ptr + t * stride_qt + h * stride_qh + d, mask=dmask, other=0.0).to(tl.float32)
    m_i = tl.max(tl.full([BLOCK_N], float("-inf"), tl.float32), axis=0)
    l_i = tl.sum(tl.zeros([BLOCK_N], tl.float32), axis=0)
    acc = tl.zeros([BLOCK_D], tl.float32)
    n = tl.arange(0, BLOCK_N)
    for c0 in range(0, ctx, BLOCK_N):
        col = c0 + n  # [BLOCK_N]
        in_ctx = col < ctx
        block = tl.load(bt_ptr + b * stride_bt + col // BLOCK_SIZE, mask=in_ctx, other=0)
        slot = block * BLOCK_SIZE + col % BLOCK_SIZE
        node = tl.minimum(tl.maximum(col - first_col, 0), 63)
        seen_node = ((bits >> node) & 1) != 0
        visible = in_ctx & (((col < first_col) & (col <= q_col)) | ((col >= first_col) & seen_node))
        kv_off = slot[:, None] * stride_ks + kvh * stride_kh + d[None, :]
        kv_mask = visible[:, None] & dmask[None, :]
        k = tl.load(k_ptr + kv_off, mask=kv_mask, other=0.0).to(tl.float32)  # [BLOCK_N, BLOCK_D]
        s = tl.sum(k * q[None, :], axis=1) * scale  # [BLOCK_N]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        # a chunk with nothing visible yet keeps m at -inf: guard the exponentials
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe)  # [BLOCK_N], 0 where invisible
        v = tl.load(v_ptr + kv_off, mask=kv_mask, other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
    out = tl.where(l_i > 0, acc / tl.where(l_i > 0, l_i, 1.0), 0.0)
    tl.store(out_ptr + t * stride_ot + h * stride_oh + d,
             out.to(out_ptr.dtype.element_ty), mask=dmask)


def paged_attention_triton(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           rows, scale: float) -> torch.Tensor:
    """kernels.paged_attention.paged_attention's contract, as one Triton launch (`rows`: its
    PagedRows)."""
    block_tables, block_size, start, context_lens, packed_index, max_q, first_node, node_bits = rows
    t, hq, d = query.shape
    hkv = k_cache.shape[1]
    if k_cache.stride() != v_cache.stride() or k_cache.stride(2) != 1 or query.stride(2) != 1:
        raise ValueError("paged attention expects contiguous heads in the caches and queries")
    out = torch.empty_like(query)
    if t == 0:
        return out
    block_d = triton.next_power_of_2(d)
    _paged_attention_kernel[(t, hq)](
        query, query.stride(0), query.stride(1),
        k_cache, v_cache, k_cache.stride(0), k_cache.stride(1),
        block_tables, block_tables.stride(0),
        start, context_lens, first_node,
        packed_index, node_bits,
        out, out.stride(0), out.stride(1),
        float(scale), max_q, hq // hkv, d,
        BLOCK_SIZE=block_size, BLOCK_N=32, BLOCK_D=block_d,
    )
    return out
