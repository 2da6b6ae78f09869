"""Triton tree sampler: one program per sequence, the same inputs and random numbers as the
PyTorch reference (kernels/tree_rejection.py), token for token.

Used by `kernels.tree_rejection.tree_rejection_sample` on CUDA (and on MLU with Cambricon's
Triton); tested on the CPU against the reference through Triton's interpreter (TRITON_INTERPRET=1,
read when this module is imported).

Program i walks its tree from the root, depth by depth. At the current node it tries the children
in rank order (the host-built table children [S, N + 1, C]): a deterministic row (greedy or seeded)
accepts the child equal to its precomputed choice; an unseeded sampled row accepts child c iff
u_c * q_c(c) < p(c), and on a rejection replaces p by max(0, p - q_c) (kept unnormalised with its
sum z, as the reference does). The residual lives in a per-sequence scratch of two rows of the
vocabulary [S, 2, V] and is updated by streaming BLOCK_V chunks; the current row flips between the
two. When no child is accepted the row emits its choice (deterministic) or the exponential race
argmax(r / E) (sampled); at a node without children that is the bonus token.

Sums over the vocabulary are taken in chunks here and by torch's reduction in the reference, so z
can differ in its last bits: a decision u * q < r(c) / z on the very boundary could differ, which
the tests do not meet on random data (a difference of one ulp in a uniform's comparison).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_rejection import KernelInputs, program_sequence, q_at, q_chunk

__all__ = ["tree_rejection_sample_triton"]


# the tree's depth, width and the outputs' row strides change per step: no variant per value
# (see kernels/triton_paged_attention.py)
@triton.jit(do_not_specialize=["stride_o", "stride_n", "MAX_DEPTH", "MAX_CHILDREN",
                               "K_SPARSE"])
def _tree_kernel(
    target_ptr, stride_t,  # target_probs [T, V]
    draft_ids_ptr,  # [D]
    q_ptr, stride_q,  # dense q [D, V] or sparse probs [D, K]
    q_idx_ptr, stride_qi,  # sparse indices [D, K]
    children_ptr, stride_cs, stride_cn,  # [S, N + 1, C]: global node, -1 padded
    draft_off_ptr, target_off_ptr,  # [S] each
    det_ptr,  # int8 [S]: greedy or seeded
    uniform_ptr,  # [D]
    exp_ptr, stride_e,  # [S, V]
    choice_ptr,  # [T]: argmax or keyed choice per target row
    work_ptr, stride_w,  # fp32 [S, 2, V] scratch
    out_ptr, stride_o,  # [S, MAX_DEPTH + 1], pre-filled with the placeholder
    nodes_ptr, stride_n,  # [S, max(MAX_DEPTH, 1)], pre-filled with -1
    num_acc_ptr,  # [S]
    V, MAX_DEPTH, MAX_CHILDREN, K_SPARSE,
    Q_MODE: tl.constexpr,
    HAS_DET: tl.constexpr,
    HAS_SAMPLED: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # block masks are built by comparisons only (bool-block & bool-scalar misbehaves in the
    # interpreter)
    i, d_off, t_off, det = program_sequence(draft_off_ptr, target_off_ptr, det_ptr)
    koffs = tl.arange(0, BLOCK_K)
    work = work_ptr + i * stride_w

    cur = d_off * 0  # slot: 0 the root, r + 1 node r
    n_acc = d_off * 0
    alive = d_off >= 0
    for depth in range(0, MAX_DEPTH + 1):
        row = t_off + cur
        sampling = alive & (det == 0)
        buf = cur * 0  # which scratch row holds r
        z = 1.0
        if HAS_SAMPLED:
            for start in range(0, V, BLOCK_V):  # r <- the target row (only rows that sample)
                offs = start + tl.arange(0, BLOCK_V)
                vm = offs < tl.where(sampling, V, 0)
                p = tl.load(target_ptr + row * stride_t + offs, mask=vm, other=0.0)
                tl.store(work + offs, p.to(tl.float32), mask=vm)
        took = cur * 0 - 1
        for c in range(0, MAX_CHILDREN):
            child = tl.load(children_ptr + i * stride_cs + cur * stride_cn + c)
            trying = alive & (child >= 0) & (took < 0)
            safe = tl.maximum(child, 0)
            tok = tl.load(draft_ids_ptr + safe, mask=trying, other=0)
            accept = trying & (det == 0)
            if HAS_SAMPLED:
                tries = trying & (det == 0)
                p_tok = tl.load(work + buf * V + tok, mask=tries, other=0.0) / z
                q_tok = q_at(q_ptr, stride_q, q_idx_ptr, stride_qi, safe, tok, koffs, K_SPARSE,
                             tries, Q_MODE)
                u = tl.load(uniform_ptr + safe, mask=tries, other=1.0)
                accept = u * q_tok < p_tok
                rejected = tries & (accept == 0)
                # residual max(0, r / z - q) into the other row; its sum and whether any > 0
                other = 1 - buf
                s_res = 0.0
                s_rz = 0.0
                any_pos = 0
                for start in range(0, V, BLOCK_V):
                    offs = start + tl.arange(0, BLOCK_V)
                    vm = offs < tl.where(rejected, V, 0)
                    r = tl.load(work + buf * V + offs, mask=vm, other=0.0)
                    q = q_chunk(q_ptr, stride_q, q_idx_ptr, stride_qi, safe, tok, offs, koffs,
                                K_SPARSE, V, rejected, Q_MODE)
                    rz = r / z
                    res = tl.maximum(rz - q, 0.0)
                    tl.store(work + other * V + offs, res, mask=vm)
                    s_res += tl.sum(tl.where(vm, res, 0.0), axis=0)
                    s_rz += tl.sum(tl.where(vm, rz, 0.0), axis=0)
                    any_pos = tl.maximum(any_pos,
                                         (tl.max(tl.where(vm, res, 0.0), axis=0) > 0).to(tl.int32))
                # a residual zero everywhere comes only from rounding (p == q): p stays
                keep_p = rejected & (any_pos == 0)
                for start in range(0, V, BLOCK_V):
                    offs = start + tl.arange(0, BLOCK_V)
                    vm = offs < tl.where(keep_p, V, 0)
                    r = tl.load(work + buf * V + offs, mask=vm, other=0.0)
                    tl.store(work + other * V + offs, r / z, mask=vm)
                z = tl.where(rejected, tl.where(any_pos > 0, s_res, s_rz), z)
                buf = tl.where(rejected, other, buf)
            if HAS_DET:
                ch = tl.load(choice_ptr + row, mask=trying, other=-1)
                accept = tl.where(det, tok == ch, accept)
            took = tl.where(trying & accept, child, took)

        descend = took >= 0
        stop = alive & (descend == 0)
        extra = cur * 0
        if HAS_SAMPLED:  # exponential race over the residual (or the bonus row)
            best = -1.0
            best_idx = cur * 0
            for start in range(0, V, BLOCK_V):
                offs = start + tl.arange(0, BLOCK_V)
                vm = offs < tl.where(stop & (det == 0), V, 0)
                r = tl.load(work + buf * V + offs, mask=vm, other=0.0)
                e = tl.load(exp_ptr + i * stride_e + offs, mask=vm, other=1.0)
                s = tl.where(vm, r / e, -1.0)
                m = tl.max(s, axis=0)
                a = tl.argmax(s, axis=0) + start
                best_idx = tl.where(m > best, a, best_idx)  # earliest index wins ties
                best = tl.maximum(best, m)
            extra = best_idx.to(tl.int64)
        if HAS_DET:
            ch = tl.load(choice_ptr + row, mask=stop, other=0)
            extra = tl.where(det, ch, extra)
        tok_took = tl.load(draft_ids_ptr + tl.maximum(took, 0), mask=descend, other=0)
        tl.store(out_ptr + i * stride_o + depth, tl.where(descend, tok_took, extra),
                 mask=descend | stop)
        tl.store(nodes_ptr + i * stride_n + depth, took - d_off, mask=descend & (depth < MAX_DEPTH))
        n_acc += descend.to(tl.int64)
        cur = tl.where(descend, took - d_off + 1, cur)
        alive = descend
    tl.store(num_acc_ptr + i, n_acc)


def tree_rejection_sample_triton(target_probs: torch.Tensor, draft_token_ids: torch.Tensor,
                                 draft_probs, children: torch.Tensor, max_depth: int,
                                 draft_offsets: torch.Tensor, target_offsets: torch.Tensor,
                                 det_host: torch.Tensor, uniforms, exps, choice
                                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(output_token_ids [S, max_depth + 1], accepted_nodes [S, max_depth], num_accepted [S]),
    from the inputs `tree_rejection_sample` prepared (its randoms and choices)."""
    device = target_probs.device
    b, vocab = children.shape[0], target_probs.shape[1]
    out = torch.full((b, max_depth + 1), -1, dtype=torch.int64, device=device)
    nodes = torch.full((b, max(max_depth, 1)), -1, dtype=torch.int64, device=device)
    num_acc = torch.zeros(b, dtype=torch.int64, device=device)
    if b == 0:
        return out, nodes[:, :max_depth], num_acc
    k = KernelInputs.of(target_probs, draft_token_ids, draft_probs)
    target, draft_ids, dummy_f, dummy_i = k.target, k.draft_ids, k.dummy_f, k.dummy_i
    q_mode, q, q_idx, k_sparse = k.q_mode, k.q, k.q_idx, k.k_sparse
    block_v, block_k = k.block_v, k.block_k
    has_sampled = exps is not None
    work = (torch.empty((b, 2, vocab), dtype=torch.float32, device=device) if has_sampled
            else dummy_f)
    children = children.to(device, non_blocking=True).contiguous()
    _tree_kernel[(b,)](
        target, target.stride(0), draft_ids,
        q, q.stride(0) if q.dim() == 2 else 0, q_idx, q_idx.stride(0) if q_idx.dim() == 2 else 0,
        children, children.stride(0), children.stride(1),
        draft_offsets.to(device, non_blocking=True), target_offsets.to(device, non_blocking=True),
        det_host.to(torch.int8).to(device, non_blocking=True),
        uniforms if uniforms is not None and uniforms.numel() else dummy_f,
        exps if has_sampled else dummy_f, exps.stride(0) if has_sampled else 0,
        choice if choice is not None else dummy_i,
        work, work.stride(0) if has_sampled else 0,
        out, out.stride(0), nodes, nodes.stride(0), num_acc,
        vocab, max_depth, children.shape[2], k_sparse,
        Q_MODE=q_mode, HAS_DET=choice is not None, HAS_SAMPLED=has_sampled,
        BLOCK_V=block_v, BLOCK_K=block_k,
    )
    return out, nodes[:, :max_depth], num_acc
