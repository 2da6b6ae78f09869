"""Batched rejection sampling for speculative decoding (lossless).

Ragged layout. Sequence i of the batch speculated k_i draft tokens (k_i may be 0):
    target_probs    [T, V], T = sum_i (k_i + 1): for sequence i, k_i + 1 contiguous rows, in batch
                    order: p at the positions of d_1..d_{k_i}, then the bonus position.
    draft_token_ids [D], D = sum_i k_i, flattened in the same order.
    draft_probs     None (every draft is one-hot: n-gram, greedy drafts), a dense [D, V] tensor, or
                    SparseProbs (top-K indices + probs) with D rows.

Per sampled row (Leviathan et al. / Chen et al.):
    accept d_j with probability min(1, p_j(d_j) / q_j(d_j)), i.e. iff u_j * q_j(d_j) < p_j(d_j);
    at the first rejection emit a token from normalize(max(0, p_j - q_j)) and stop;
    if all k_i drafts are accepted emit a token from the bonus row p_{k_i + 1}.
With a one-hot q at d this reads: accept with probability p(d); on rejection, sample p with d
removed, renormalised. The emitted tokens are distributed exactly as sampling p alone would be.
Greedy rows accept d_j iff d_j == argmax(p_j) and emit argmax of the first rejected (or bonus) row;
they consume no random numbers.

Seeded sampled rows are verified by coupling instead: their token at position t is
    g_t = argmax(p_t / E(seed, t)), E keyed noise (kernels.sampling.noise_key), whatever was
    drafted; a draft is accepted iff it equals g_t. Accepting d costs probability p(d), exactly as
    rejection sampling a one-hot draft does, and the output is a pure function of (seed, position,
    p): the same with speculation on or off, any k, a dropped draft, any batch, or after a resume
    elsewhere. The draft proposers sample seeded drafts with the same keyed noise, which makes
    agreement likely.
    In the kernels seeded rows therefore travel as greedy rows whose "argmax" is g_t.

Random numbers of unseeded sampled rows (all drawn before any compute, so every implementation
sees the same ones), from the default RNG:
    u  [D]     uniforms for acceptance, only for rows with k_i > 0;
    E  [S, V]  Exp(1) noise, one row per sequence: exactly one non-draft token is emitted per
               sequence, via the exponential race argmax(r / E) over its residual or bonus row r.

`rejection_sample(..., impl="auto")` runs the Triton kernel on CUDA / MLU tensors when triton is
importable and this PyTorch reference otherwise. Importing this module never imports triton.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

from kernels.layout import PLACEHOLDER_TOKEN_ID, RejectionResult, StepLayout
from kernels.sampler_inputs import DraftProbs, SamplerInputs
from kernels.sampling import draw_exponentials, keyed_argmax, noise_key
from kernels.sparse_probs import SparseProbs

__all__ = [
    "PLACEHOLDER_TOKEN_ID",
    "SparseProbs",
    "RejectionResult",
    "StepLayout",
    "greedy_chain_verify",
    "greedy_verify",
    "rejection_sample",
]

LayoutLike = Union[StepLayout, torch.Tensor, Sequence[int]]


def as_layout(layout: LayoutLike) -> StepLayout:
    """A StepLayout, or num_draft_tokens [S] for a sampler-only batch."""
    return layout if isinstance(layout, StepLayout) else StepLayout.for_drafts(layout)


def _host_bools(flags: Union[torch.Tensor, Sequence[bool]], n: int, name: str) -> torch.Tensor:
    t = torch.as_tensor(flags, dtype=torch.bool).cpu().reshape(-1)
    if t.numel() != n:
        raise ValueError(f"{name} has {t.numel()} entries for a batch of {n}")
    return t


def draw_uniforms(layout: StepLayout, rows: Sequence[int], device: torch.device) -> torch.Tensor:
    """Acceptance uniforms u [D] for the drafts of sequences `rows` (default RNG); other slots are
    left unset."""
    uniforms = torch.empty(layout.num_drafts, dtype=torch.float32, device=device)
    k = layout.num_draft_tokens.tolist()
    off = layout.draft_offsets.tolist()
    rows = [i for i in rows if k[i] > 0]
    n = sum(k[i] for i in rows)
    if n == layout.num_drafts:
        uniforms.uniform_()
    elif n:
        idx = torch.cat([torch.arange(off[i], off[i] + k[i]) for i in rows])
        uniforms[idx.to(device, non_blocking=True)] = torch.rand(n, device=device)
    return uniforms


def _seeded_rows(
    greedy_host: torch.Tensor, seeds: Optional[Sequence[Optional[int]]], n: int
) -> list[int]:
    if seeds is None:
        return []
    if len(seeds) != n:
        raise ValueError(f"seeds has {len(seeds)} entries for a batch of {n}")
    return [
        i for i, (g, s) in enumerate(zip(greedy_host.tolist(), seeds)) if s is not None and not g
    ]


def _coupled_argmax(
    target_probs: torch.Tensor,
    layout: StepLayout,
    seeded: Sequence[int],
    seeds: Sequence[Optional[int]],
    target_argmax: torch.Tensor,
) -> torch.Tensor:
    """target_argmax [T] with every row of a seeded sequence replaced by its keyed sample g_t."""
    k = layout.num_draft_tokens.tolist()
    toff = layout.target_offsets.tolist()
    pos = layout.sample_positions.tolist()
    rows = [toff[i] + j for i in seeded for j in range(k[i] + 1)]
    keys = [noise_key(seeds[i], pos[i] + j) for i in seeded for j in range(k[i] + 1)]
    idx = torch.tensor(rows, dtype=torch.int64).to(target_probs.device, non_blocking=True)
    out = target_argmax.clone()
    out[idx] = keyed_argmax(target_probs[idx], keys)
    return out


def _draft_prob_at(
    draft_probs: DraftProbs, rows: torch.Tensor, tokens: torch.Tensor
) -> torch.Tensor:
    """q at (rows, tokens), any matching shapes -> float32 of that shape."""
    if draft_probs is None:
        return torch.ones(tokens.shape, dtype=torch.float32, device=tokens.device)
    if isinstance(draft_probs, SparseProbs):
        idx = draft_probs.indices[rows]  # [..., K]
        pr = draft_probs.probs[rows].to(torch.float32)
        return torch.where(idx == tokens.unsqueeze(-1), pr, torch.zeros_like(pr)).sum(-1)
    return draft_probs[rows, tokens].to(torch.float32)


def _draft_rows_dense(
    draft_probs: DraftProbs,
    draft_token_ids: torch.Tensor,
    rows: torch.Tensor,
    present: torch.Tensor,
    vocab: int,
) -> torch.Tensor:
    """Dense q [B, V] at draft rows `rows` [B]; zero where present [B] is False."""
    b = rows.shape[0]
    device = rows.device
    q = torch.zeros(b, vocab, dtype=torch.float32, device=device)
    if draft_probs is None:
        src = present.to(torch.float32).unsqueeze(1)
        return q.scatter_(1, draft_token_ids[rows].unsqueeze(1), src)
    if isinstance(draft_probs, SparseProbs):
        pr = draft_probs.probs[rows].to(torch.float32)
        pr = torch.where(present.unsqueeze(1), pr, torch.zeros_like(pr))
        return q.scatter_add_(1, draft_probs.indices[rows], pr)
    dense = draft_probs[rows].to(torch.float32)
    return torch.where(present.unsqueeze(1), dense, q)


def _validate(
    target_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    layout: StepLayout,
    draft_probs: DraftProbs,
) -> None:
    if target_probs.dim() != 2:
        raise ValueError(f"target_probs must be [T, V], got {tuple(target_probs.shape)}")
    expected_t = layout.num_drafts + layout.batch_size
    if target_probs.shape[0] != expected_t:
        raise ValueError(
            f"target_probs has {target_probs.shape[0]} rows, expected sum(k_i + 1) = {expected_t}"
        )
    if draft_token_ids.numel() != layout.num_drafts:
        raise ValueError(
            f"draft_token_ids has {draft_token_ids.numel()} entries, "
            f"expected sum(k_i) = {layout.num_drafts}"
        )
    if isinstance(draft_probs, SparseProbs):
        if draft_probs.num_rows != layout.num_drafts:
            raise ValueError(
                f"draft_probs has {draft_probs.num_rows} rows, expected {layout.num_drafts}"
            )
    elif draft_probs is not None:
        if tuple(draft_probs.shape) != (layout.num_drafts, target_probs.shape[1]):
            raise ValueError(
                f"dense draft_probs must be [{layout.num_drafts}, {target_probs.shape[1]}], "
                f"got {tuple(draft_probs.shape)}"
            )


def _use_triton(device: torch.device, impl: str) -> bool:
    if impl == "reference":
        return False
    if impl == "triton":
        return True
    if impl != "auto":
        raise ValueError(f"impl must be 'auto', 'reference' or 'triton', got {impl!r}")
    from kernels._triton_support import triton_available

    return device.type in ("cuda", "mlu") and triton_available()


def rejection_sample(
    target_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    layout: LayoutLike,
    draft_probs: DraftProbs,
    is_greedy: Union[torch.Tensor, Sequence[bool]],
    seeds: Optional[Sequence[Optional[int]]] = None,
    impl: str = "auto",
) -> RejectionResult:
    """Lossless speculative verification of a ragged batch (see the module docstring).

    target_probs [T, V]; draft_token_ids int64 [D]; layout: the step's StepLayout, or
    num_draft_tokens int64 [S] for a sampler-only batch (sample positions 1, 1, ...);
    draft_probs None | dense [D, V] | SparseProbs (D rows); is_greedy bool [S] (keep it on the CPU
    as well: it decides, on the host, which rows draw random numbers); seeds: S entries of
    int | None (None for all: every sampled row unseeded). impl: "auto" | "reference" | "triton".
    """
    layout = as_layout(layout)
    draft_token_ids = draft_token_ids.reshape(-1).to(torch.int64)
    _validate(target_probs, draft_token_ids, layout, draft_probs)
    device = target_probs.device
    vocab = target_probs.shape[1]
    greedy_host = _host_bools(is_greedy, layout.batch_size, "is_greedy")
    seeded = _seeded_rows(greedy_host, seeds, layout.batch_size)
    # seeded rows are verified by coupling: deterministic given their keyed argmax
    det_host = greedy_host.clone()
    det_host[seeded] = True
    sampled_rows = [i for i, g in enumerate(det_host.tolist()) if not g]

    # all randomness first: uniforms, then noise (default RNG, unseeded sampled rows only)
    uniforms = draw_uniforms(layout, sampled_rows, device) if sampled_rows else None
    exps = draw_exponentials(layout.batch_size, vocab, device) if sampled_rows else None
    target_argmax = None
    if len(sampled_rows) < layout.batch_size:
        target_argmax = target_probs.argmax(dim=-1)  # [T]
        if seeded:
            target_argmax = _coupled_argmax(target_probs, layout, seeded, seeds, target_argmax)

    inputs = SamplerInputs(target_probs, draft_token_ids, layout, draft_probs, det_host, uniforms,
                           exps, target_argmax)
    if _use_triton(device, impl):
        from kernels.triton_rejection import rejection_sample_triton

        return rejection_sample_triton(inputs)
    return rejection_sample_reference(inputs)


def greedy_verify(logits: torch.Tensor, draft_token_ids: torch.Tensor,
                  layout: LayoutLike) -> RejectionResult:
    """`rejection_sample` for a batch whose rows are all greedy, straight from the logits [T, V]:
    a draft is accepted iff it is its row's argmax, and the extra token is the argmax of the
    first rejected (or the bonus) row. Greedy target probabilities are one-hot at
    logits.argmax (apply_sampling_params), so the tokens are the same; no probabilities, no
    random numbers."""
    layout = as_layout(layout)
    draft_token_ids = draft_token_ids.reshape(-1).to(torch.int64)
    _validate(logits, draft_token_ids, layout, None)
    device = logits.device
    draft_idx, target_idx, valid = (t.to(device, non_blocking=True)
                                    for t in layout.padded_indices())
    drafts = (draft_token_ids[draft_idx] if layout.num_drafts
              else torch.zeros(draft_idx.shape, dtype=torch.int64, device=device))
    tokens, num_accepted = greedy_chain_verify(
        logits.argmax(dim=-1), drafts, valid, target_idx,
        layout.target_offsets.to(device, non_blocking=True))
    return RejectionResult(tokens, num_accepted)


def greedy_chain_verify(argmax: torch.Tensor, draft_ids: torch.Tensor, valid: torch.Tensor,
                        target_idx: torch.Tensor, bonus_base: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy chain verification on padded index arrays, with no host sync (the form a captured
    step runs). argmax [L]: each logits row's argmax; draft_ids, valid, target_idx [S, K]: row
    s's draft j, whether it exists, the logits row that judges it; bonus_base [S]: row s's
    first logits row. Returns output tokens [S, K + 1] (PLACEHOLDER_TOKEN_ID padded) and
    num_accepted [S]."""
    s, k = draft_ids.shape
    valid = valid.to(torch.bool)
    accept = (draft_ids == argmax[target_idx]) & valid  # [S, K]
    num_accepted = accept.to(torch.int64).cumprod(dim=1).sum(dim=1)  # drafts before a rejection
    j = torch.arange(k, device=draft_ids.device)
    out = torch.full((s, k + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int64,
                     device=draft_ids.device)
    out[:, :k] = torch.where(j < num_accepted[:, None], draft_ids, out[:, :k])
    # the argmax of the first rejected row, or of the bonus row when all were accepted
    extra = argmax[bonus_base + num_accepted]
    out.scatter_(1, num_accepted[:, None], extra[:, None])
    return out, num_accepted


def rejection_sample_reference(inputs: SamplerInputs) -> RejectionResult:
    """Plain PyTorch rejection sampler over pre-drawn random numbers (no per-row Python loops)."""
    target_probs, draft_token_ids, layout = (inputs.target_probs, inputs.draft_token_ids,
                                             inputs.layout)
    draft_probs, greedy_host = inputs.draft_probs, inputs.greedy_host
    uniforms, exps, target_argmax = inputs.uniforms, inputs.exps, inputs.target_argmax
    # target_probs: [T, V]; draft_token_ids: [D]; uniforms: [D]; exps: [B, V]; target_argmax: [T]
    device = target_probs.device
    b, max_k, vocab = layout.batch_size, layout.max_k, target_probs.shape[1]
    any_sampled = exps is not None
    any_greedy = target_argmax is not None
    greedy = greedy_host.to(device, non_blocking=True)  # [B]
    k = layout.num_draft_tokens.to(device, non_blocking=True)  # [B]
    out = torch.full((b, max_k + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int64, device=device)

    if max_k > 0:
        draft_idx, target_idx, valid = (
            t.to(device, non_blocking=True) for t in layout.padded_indices()
        )
        d = draft_token_ids[draft_idx]  # [B, max_k]
        accept = torch.zeros(b, max_k, dtype=torch.bool, device=device)
        if any_sampled:
            p_d = target_probs[target_idx, d].to(torch.float32)  # [B, max_k]
            q_d = _draft_prob_at(draft_probs, draft_idx, d)  # [B, max_k]
            # accept with prob min(1, p/q): u * q < p (p = 0 never accepts)
            accept = uniforms[draft_idx] * q_d < p_d
        if any_greedy:
            accept = torch.where(greedy.unsqueeze(1), d == target_argmax[target_idx], accept)
        accept &= valid
        # accepted prefix = drafts before the first rejection
        num_accepted = accept.to(torch.int64).cumprod(dim=1).sum(dim=1)  # [B]
        j = torch.arange(max_k, device=device)
        out[:, :max_k] = torch.where(
            j < num_accepted.unsqueeze(1), d, torch.full_like(d, PLACEHOLDER_TOKEN_ID)
        )
    else:
        num_accepted = torch.zeros(b, dtype=torch.int64, device=device)

    # one extra token per row: recovered at the first rejection, or bonus when all were accepted
    target_offsets = layout.target_offsets.to(device, non_blocking=True)
    extra_rows = target_offsets + num_accepted  # [B] rows of target_probs
    extra = torch.zeros(b, dtype=torch.int64, device=device)
    if any_sampled:
        p_x = target_probs[extra_rows].to(torch.float32)  # [B, V]
        if layout.num_drafts > 0:
            rejected = num_accepted < k  # [B]
            draft_offsets = layout.draft_offsets.to(device, non_blocking=True)
            x_draft_rows = (draft_offsets + num_accepted).clamp(max=layout.num_drafts - 1)
            q_x = _draft_rows_dense(draft_probs, draft_token_ids, x_draft_rows, rejected, vocab)
            # residual max(0, p - q); zero everywhere only through rounding (p == q), then fall back
            # to p
            r = (p_x - q_x).clamp_(min=0.0)
            r = torch.where((r > 0).any(dim=1, keepdim=True), r, p_x)
        else:
            r = p_x
        # exponential race over the unnormalised residual
        extra = (r / exps).argmax(dim=1)
    if any_greedy:
        extra = torch.where(greedy, target_argmax[extra_rows], extra)
    out.scatter_(1, num_accepted.unsqueeze(1), extra.unsqueeze(1))
    return RejectionResult(output_token_ids=out, num_accepted=num_accepted)

