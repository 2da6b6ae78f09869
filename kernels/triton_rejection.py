"""Triton rejection sampler: one program per sequence, same inputs and random numbers as the
reference.

Used by `kernels.rejection.rejection_sample` on CUDA (and on MLU with Cambricon's Triton); tested on
the CPU against the PyTorch reference through Triton's interpreter (TRITON_INTERPRET=1, read when
this module is imported, because that is when the kernel is defined).

Program i walks its k_i drafts (accept iff u * q(d) < p(d), or d == argmax(p) for greedy rows),
stops at the first rejection, then, for sampled rows only, streams the chosen target row in
BLOCK_V chunks keeping a running argmax of max(0, p - q) / E (and of p / E, the fallback when the
residual is zero everywhere). Greedy rows read the precomputed argmax and skip the vocabulary loop.
The uniforms, the Exp(1) noise and the greedy argmax are computed by the caller with torch, so the
kernel is a pure function of its inputs and matches the reference token for token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.layout import PLACEHOLDER_TOKEN_ID, RejectionResult
from kernels.sampler_inputs import SamplerInputs
from kernels.sparse_probs import SparseProbs

__all__ = ["KernelInputs", "program_sequence", "q_at", "q_chunk", "rejection_sample_triton"]

_Q_ONE_HOT, _Q_DENSE, _Q_SPARSE = 0, 1, 2


@triton.jit
def program_sequence(draft_off_ptr, target_off_ptr, flag_ptr):
    """Program i's sequence i: where its drafts and its target rows start, and its int8 flag as
    a bool (greedy for chains; greedy or seeded for trees). Both kernels start with it."""
    i = tl.program_id(0).to(tl.int64)
    return i, tl.load(draft_off_ptr + i), tl.load(target_off_ptr + i), tl.load(flag_ptr + i) != 0


@triton.jit
def q_at(q_ptr, stride_q, q_idx_ptr, stride_qi, node, tok, koffs, K_SPARSE, valid,
         Q_MODE: tl.constexpr):
    """q of draft node `node` at token `tok` (one-hot: 1; 0 where not valid). Both kernels'
    acceptance test reads it: chains here, trees in triton_tree_rejection.py."""
    if Q_MODE == 0:
        q = tl.where(valid, 1.0, 0.0)
    elif Q_MODE == 1:
        q = tl.load(q_ptr + node * stride_q + tok, mask=valid, other=0.0).to(tl.float32)
    else:
        km = koffs < tl.where(valid, K_SPARSE, 0)
        idx = tl.load(q_idx_ptr + node * stride_qi + koffs, mask=km, other=-1)
        pr = tl.load(q_ptr + node * stride_q + koffs, mask=km, other=0.0).to(tl.float32)
        q = tl.sum(tl.where(idx == tok, pr, 0.0), axis=0)
    return q


@triton.jit
def q_chunk(q_ptr, stride_q, q_idx_ptr, stride_qi, node, tok, offs, koffs, K_SPARSE, V, valid,
            Q_MODE: tl.constexpr):
    """q of draft node `node` over the vocabulary chunk `offs` (zero where not valid; one-hot:
    1 at `tok`): what a rejection's residual max(0, p - q) subtracts, in both kernels."""
    if Q_MODE == 0:
        q = tl.where(offs == tl.where(valid, tok, -1), 1.0, 0.0)
    elif Q_MODE == 1:
        q = tl.load(q_ptr + node * stride_q + offs, mask=offs < tl.where(valid, V, 0),
                    other=0.0).to(tl.float32)
    else:
        km = koffs < tl.where(valid, K_SPARSE, 0)
        idx = tl.load(q_idx_ptr + node * stride_qi + koffs, mask=km, other=-1)
        pr = tl.load(q_ptr + node * stride_q + koffs, mask=km, other=0.0).to(tl.float32)
        q = tl.sum(tl.where(idx[:, None] == offs[None, :], pr[:, None], 0.0), axis=0)
    return q



# the draft length and the output's row stride change per step: no variant per value (see
# kernels/triton_paged_attention.py)
@triton.jit(do_not_specialize=["stride_o", "MAX_K", "K_SPARSE"])
def _rejection_kernel(
    target_ptr,
    stride_t,  # target_probs [T, V]
    draft_ids_ptr,  # [D]
    q_ptr,
    stride_q,  # dense q [D, V] or sparse probs [D, K]
    q_idx_ptr,
    stride_qi,  # sparse indices [D, K]
    num_draft_ptr,
    draft_off_ptr,
    target_off_ptr,  # [B] each
    greedy_ptr,  # int8 [B]
    uniform_ptr,  # [D]
    exp_ptr,
    stride_e,  # [B, V]
    argmax_ptr,  # [T]
    out_ptr,
    stride_o,  # [B, max_k + 1], pre-filled with the placeholder
    num_acc_ptr,  # [B]
    V,
    MAX_K,
    K_SPARSE,
    Q_MODE: tl.constexpr,
    HAS_GREEDY: tl.constexpr,
    HAS_SAMPLED: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # masks are built by comparisons only (bool-block & bool-scalar misbehaves in the interpreter)
    i, d_off, t_off, greedy = program_sequence(draft_off_ptr, target_off_ptr, greedy_ptr)
    k = tl.load(num_draft_ptr + i)
    koffs = tl.arange(0, BLOCK_K)

    n_acc = k * 0
    alive = k >= 0
    for j in range(0, MAX_K):
        valid = alive & (j < k)
        d = tl.load(draft_ids_ptr + d_off + j, mask=valid, other=0)
        row = t_off + j
        acc = valid
        if HAS_SAMPLED:
            p = tl.load(target_ptr + row * stride_t + d, mask=valid, other=0.0).to(tl.float32)
            q = q_at(q_ptr, stride_q, q_idx_ptr, stride_qi, d_off + j, d, koffs, K_SPARSE, valid,
                     Q_MODE)
            u = tl.load(uniform_ptr + d_off + j, mask=valid & (greedy == 0), other=1.0)
            # accept with prob min(1, p / q)
            acc = u * q < p
        if HAS_GREEDY:
            am = tl.load(argmax_ptr + row, mask=valid, other=-1)
            acc = tl.where(greedy, am == d, acc)
        acc = acc & valid
        tl.store(out_ptr + i * stride_o + j, d, mask=acc)
        n_acc += acc.to(tl.int64)
        alive = acc

    # one extra token: recovered at row t_off + n_acc (first rejection) or bonus (n_acc == k)
    row = t_off + n_acc
    tok = n_acc * 0
    if HAS_GREEDY:
        tok = tl.load(argmax_ptr + row)
    if HAS_SAMPLED:
        rejected = n_acc < k
        x_draft = d_off + n_acc
        d_rej = tl.load(draft_ids_ptr + x_draft, mask=rejected, other=-1)
        best_r = -1.0
        best_r_idx = 0
        best_p = -1.0
        best_p_idx = 0
        any_pos = 0
        v_end = tl.where(greedy, 0, V)  # greedy rows skip the vocabulary loop
        for start in range(0, v_end, BLOCK_V):
            offs = start + tl.arange(0, BLOCK_V)
            vm = offs < V
            p = tl.load(target_ptr + row * stride_t + offs, mask=vm, other=0.0).to(tl.float32)
            # q only matters at a rejection (zero when all were accepted)
            q = q_chunk(q_ptr, stride_q, q_idx_ptr, stride_qi, x_draft, d_rej, offs, koffs,
                        K_SPARSE, V, rejected, Q_MODE)
            # residual max(0, p - q), raced with the row's Exp(1) noise
            r = tl.maximum(p - q, 0.0)
            e = tl.load(exp_ptr + i * stride_e + offs, mask=vm, other=1.0)
            sr = tl.where(vm, r / e, -1.0)
            sp = tl.where(vm, p / e, -1.0)
            m_r = tl.max(sr, axis=0)
            a_r = tl.argmax(sr, axis=0) + start
            m_p = tl.max(sp, axis=0)
            a_p = tl.argmax(sp, axis=0) + start
            # strictly greater: the earliest index wins ties, as torch.argmax
            best_r_idx = tl.where(m_r > best_r, a_r, best_r_idx)
            best_r = tl.maximum(best_r, m_r)
            best_p_idx = tl.where(m_p > best_p, a_p, best_p_idx)
            best_p = tl.maximum(best_p, m_p)
            any_pos = tl.maximum(any_pos, (tl.max(r, axis=0) > 0).to(tl.int32))
        tok_s = tl.where(any_pos > 0, best_r_idx, best_p_idx).to(tl.int64)
        if HAS_GREEDY:
            tok = tl.where(greedy, tok, tok_s)
        else:
            tok = tok_s
    tl.store(out_ptr + i * stride_o + n_acc, tok)
    tl.store(num_acc_ptr + i, n_acc)


@dataclass
class KernelInputs:
    """The tensors both rejection kernels (chains here, trees in triton_tree_rejection.py) read,
    made contiguous, with placeholders where an input is absent, and the block sizes."""

    target: torch.Tensor  # [T, V], unit stride along V
    draft_ids: torch.Tensor  # [D] (one placeholder entry when D = 0)
    q_mode: int  # _Q_ONE_HOT | _Q_DENSE | _Q_SPARSE
    q: torch.Tensor  # dense [D, V] or sparse probs [D, K] (placeholder when absent)
    q_idx: torch.Tensor  # sparse indices [D, K] (placeholder when absent)
    k_sparse: int
    block_k: int
    block_v: int
    dummy_f: torch.Tensor
    dummy_i: torch.Tensor

    @classmethod
    def of(cls, target_probs: torch.Tensor, draft_token_ids: torch.Tensor, draft_probs
           ) -> "KernelInputs":
        device, vocab = target_probs.device, target_probs.shape[1]
        target = target_probs if target_probs.stride(1) == 1 else target_probs.contiguous()
        dummy_f = torch.zeros(1, dtype=torch.float32, device=device)
        dummy_i = torch.zeros(1, dtype=torch.int64, device=device)
        draft_ids = draft_token_ids.contiguous() if draft_token_ids.numel() else dummy_i
        k_sparse, block_k = 1, 1
        if draft_probs is None:
            q_mode, q, q_idx = _Q_ONE_HOT, dummy_f, dummy_i
        elif isinstance(draft_probs, SparseProbs):
            q_mode = _Q_SPARSE
            q, q_idx = draft_probs.probs.contiguous(), draft_probs.indices.contiguous()
            k_sparse = q.shape[1]
            block_k = triton.next_power_of_2(max(k_sparse, 1))
            if q.numel() == 0:
                q, q_idx = dummy_f, dummy_i
        else:
            q_mode, q, q_idx = _Q_DENSE, draft_probs.contiguous(), dummy_i
            if q.numel() == 0:
                q = dummy_f
        # the sparse path compares a [BLOCK_K, BLOCK_V] tile: keep it to ~8k elements
        block_v = min(1024, triton.next_power_of_2(vocab), max(64, 8192 // block_k))
        return cls(target, draft_ids, q_mode, q, q_idx, k_sparse, block_k, block_v, dummy_f,
                   dummy_i)


def rejection_sample_triton(inputs: SamplerInputs) -> RejectionResult:
    """Same contract as `kernels.rejection.rejection_sample_reference`."""
    layout, exps, target_argmax = inputs.layout, inputs.exps, inputs.target_argmax
    device = inputs.target_probs.device
    b, vocab = layout.batch_size, inputs.target_probs.shape[1]
    out = torch.full((b, layout.max_k + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int64, device=device)
    num_acc = torch.zeros(b, dtype=torch.int64, device=device)
    if b == 0:
        return RejectionResult(out, num_acc)

    k = KernelInputs.of(inputs.target_probs, inputs.draft_token_ids, inputs.draft_probs)
    target, draft_ids, dummy_f, dummy_i = k.target, k.draft_ids, k.dummy_f, k.dummy_i
    q_mode, q, q_idx, k_sparse = k.q_mode, k.q, k.q_idx, k.k_sparse
    block_v, block_k = k.block_v, k.block_k

    has_sampled = exps is not None
    has_greedy = target_argmax is not None
    to_dev = lambda t: t.to(device, non_blocking=True)  # noqa: E731
    _rejection_kernel[(b,)](
        target,
        target.stride(0),
        draft_ids,
        q,
        q.stride(0) if q.dim() == 2 else 0,
        q_idx,
        q_idx.stride(0) if q_idx.dim() == 2 else 0,
        to_dev(layout.num_draft_tokens),
        to_dev(layout.draft_offsets),
        to_dev(layout.target_offsets),
        to_dev(inputs.greedy_host.to(torch.int8)),
        inputs.uniforms if inputs.uniforms is not None and inputs.uniforms.numel() else dummy_f,
        exps if has_sampled else dummy_f,
        exps.stride(0) if has_sampled else 0,
        target_argmax if has_greedy else dummy_i,
        out,
        out.stride(0),
        num_acc,
        vocab,
        layout.max_k,
        k_sparse,
        Q_MODE=q_mode,
        HAS_GREEDY=has_greedy,
        HAS_SAMPLED=has_sampled,
        BLOCK_V=block_v,
        BLOCK_K=block_k,
    )
    return RejectionResult(output_token_ids=out, num_accepted=num_acc)
