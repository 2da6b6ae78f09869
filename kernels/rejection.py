"""Batched rejection sampling for speculative decoding (lossless), plus opt-in typical acceptance.

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

Random numbers (all drawn before any compute, so every implementation sees the same ones):
    u  [D]     uniforms for acceptance, only for sampled rows with k_i > 0;
    E  [B, V]  Exp(1) noise, one row per sampled sequence: exactly one non-draft token is emitted per
               sequence, via the exponential race argmax(r / E) over its residual or bonus row r.
Unseeded rows draw in one batched call from the default RNG; a seeded row draws from its own
torch.Generator, its uniforms first, then its noise, so its output does not depend on the batch (and
a seeded row with k_i = 0 emits the same token as `kernels.sampling.sample` on its bonus row).

`rejection_sample(..., impl="auto")` runs the Triton kernel on CUDA / MLU tensors when triton is
importable and this PyTorch reference otherwise. Importing this module never imports triton.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch

from kernels.sampling import draw_exponentials

__all__ = [
    "PLACEHOLDER_TOKEN_ID",
    "SparseProbs",
    "RejectionResult",
    "RaggedLayout",
    "rejection_sample",
    "typical_acceptance_sample",
]

PLACEHOLDER_TOKEN_ID = -1  # pads output_token_ids after the last valid token of a row


@dataclass
class SparseProbs:
    """A draft distribution restricted to K tokens per row.

    indices: int64 [M, K] (distinct within a row); probs: float [M, K], each row sums to 1.
    A one-hot draft (n-gram proposer, greedy draft model) is exactly SparseProbs with K = 1 and
    probs 1.0, which is how deterministic and sampled drafts share one verifier batch.
    """

    indices: torch.Tensor  # int64 [M, K]
    probs: torch.Tensor  # float [M, K]

    def __post_init__(self) -> None:
        if self.indices.dim() != 2 or self.indices.shape != self.probs.shape:
            raise ValueError(
                f"SparseProbs wants indices and probs of one [M, K] shape, got "
                f"{tuple(self.indices.shape)} and {tuple(self.probs.shape)}"
            )

    @classmethod
    def one_hot(cls, token_ids: torch.Tensor) -> "SparseProbs":
        """The deterministic draft distribution at token_ids [M] (K = 1, prob 1)."""
        idx = token_ids.reshape(-1, 1).to(torch.int64)
        return cls(indices=idx, probs=torch.ones(idx.shape, dtype=torch.float32, device=idx.device))

    @property
    def num_rows(self) -> int:
        return self.indices.shape[0]

    def to_dense(self, vocab_size: int) -> torch.Tensor:
        """Dense [M, V] float32 probabilities."""
        dense = torch.zeros(self.num_rows, vocab_size, dtype=torch.float32, device=self.probs.device)
        return dense.scatter_add_(1, self.indices, self.probs.to(torch.float32))


DraftProbs = Union[None, torch.Tensor, SparseProbs]


@dataclass
class RejectionResult:
    """output_token_ids: int64 [B, max_k + 1], row i = accepted drafts then one recovered/bonus
    token, padded with PLACEHOLDER_TOKEN_ID; num_accepted: int64 [B]. Row i has num_accepted[i] + 1
    valid tokens."""

    output_token_ids: torch.Tensor  # int64 [B, max_k + 1]
    num_accepted: torch.Tensor  # int64 [B]

    def tokens(self) -> list[list[int]]:
        """Valid tokens per row as Python lists (host copy; for tests and the servicer edge)."""
        out = self.output_token_ids.cpu().tolist()
        n = self.num_accepted.cpu().tolist()
        return [row[: a + 1] for row, a in zip(out, n)]


@dataclass(frozen=True)
class RaggedLayout:
    """Host-side index arithmetic for the ragged batch; built once per step from num_draft_tokens."""

    num_draft_tokens: torch.Tensor  # int64 [B], CPU
    draft_offsets: torch.Tensor  # int64 [B], CPU: first draft row of sequence i in [D]
    target_offsets: torch.Tensor  # int64 [B], CPU: first target row of sequence i in [T]
    batch_size: int
    num_drafts: int  # D
    max_k: int

    @classmethod
    def build(cls, num_draft_tokens: torch.Tensor) -> "RaggedLayout":
        k = torch.as_tensor(num_draft_tokens, dtype=torch.int64).cpu().reshape(-1)
        if k.numel() and int(k.min()) < 0:
            raise ValueError("num_draft_tokens must be >= 0")
        cum = k.cumsum(0)
        draft_offsets = cum - k
        target_offsets = draft_offsets + torch.arange(k.numel(), dtype=torch.int64)
        return cls(
            num_draft_tokens=k,
            draft_offsets=draft_offsets,
            target_offsets=target_offsets,
            batch_size=k.numel(),
            num_drafts=int(cum[-1]) if k.numel() else 0,
            max_k=int(k.max()) if k.numel() else 0,
        )

    def padded_indices(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(draft row, target row, valid), each [B, max_k]; invalid slots point at safe rows."""
        j = torch.arange(self.max_k, dtype=torch.int64)
        k = self.num_draft_tokens.unsqueeze(1)
        valid = j.unsqueeze(0) < k  # [B, max_k]
        draft_idx = (self.draft_offsets.unsqueeze(1) + j).clamp(max=max(self.num_drafts - 1, 0))
        target_idx = self.target_offsets.unsqueeze(1) + torch.minimum(j.unsqueeze(0), k)
        return draft_idx, target_idx, valid


def _host_bools(flags: Union[torch.Tensor, Sequence[bool]], n: int, name: str) -> torch.Tensor:
    t = torch.as_tensor(flags, dtype=torch.bool).cpu().reshape(-1)
    if t.numel() != n:
        raise ValueError(f"{name} has {t.numel()} entries for a batch of {n}")
    return t


def draw_uniforms(
    layout: RaggedLayout,
    sampled_rows: Sequence[int],
    generators: Sequence[Optional[torch.Generator]],
    device: torch.device,
) -> torch.Tensor:
    """Acceptance uniforms u [D] for the drafts of `sampled_rows`; other slots are left unset."""
    uniforms = torch.empty(layout.num_drafts, dtype=torch.float32, device=device)
    k = layout.num_draft_tokens.tolist()
    off = layout.draft_offsets.tolist()
    unseeded = [i for i in sampled_rows if generators[i] is None and k[i] > 0]
    n_unseeded = sum(k[i] for i in unseeded)
    if n_unseeded == layout.num_drafts:
        uniforms.uniform_()
    elif n_unseeded:
        idx = torch.cat([torch.arange(off[i], off[i] + k[i]) for i in unseeded]).to(device, non_blocking=True)
        uniforms[idx] = torch.rand(n_unseeded, device=device)
    for i in sampled_rows:
        gen = generators[i]
        if gen is not None and k[i] > 0:
            uniforms[off[i] : off[i] + k[i]] = torch.rand(k[i], generator=gen, device=device)
    return uniforms


def _draft_prob_at(draft_probs: DraftProbs, rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
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
    layout: RaggedLayout,
    draft_probs: DraftProbs,
    generators: Sequence[Optional[torch.Generator]],
) -> None:
    if target_probs.dim() != 2:
        raise ValueError(f"target_probs must be [T, V], got {tuple(target_probs.shape)}")
    expected_t = layout.num_drafts + layout.batch_size
    if target_probs.shape[0] != expected_t:
        raise ValueError(f"target_probs has {target_probs.shape[0]} rows, expected sum(k_i + 1) = {expected_t}")
    if draft_token_ids.numel() != layout.num_drafts:
        raise ValueError(f"draft_token_ids has {draft_token_ids.numel()} entries, expected sum(k_i) = {layout.num_drafts}")
    if len(generators) != layout.batch_size:
        raise ValueError(f"generators has {len(generators)} entries for a batch of {layout.batch_size}")
    if isinstance(draft_probs, SparseProbs):
        if draft_probs.num_rows != layout.num_drafts:
            raise ValueError(f"draft_probs has {draft_probs.num_rows} rows, expected {layout.num_drafts}")
    elif draft_probs is not None:
        if tuple(draft_probs.shape) != (layout.num_drafts, target_probs.shape[1]):
            raise ValueError(
                f"dense draft_probs must be [{layout.num_drafts}, {target_probs.shape[1]}], got {tuple(draft_probs.shape)}"
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
    num_draft_tokens: torch.Tensor,
    draft_probs: DraftProbs,
    is_greedy: Union[torch.Tensor, Sequence[bool]],
    generators: Sequence[Optional[torch.Generator]],
    impl: str = "auto",
) -> RejectionResult:
    """Lossless speculative verification of a ragged batch (see the module docstring).

    target_probs [T, V]; draft_token_ids int64 [D]; num_draft_tokens int64 [B] on CPU;
    draft_probs None | dense [D, V] | SparseProbs (D rows); is_greedy bool [B] (keep it on the CPU
    as well: it decides, on the host, which rows draw random numbers); generators: B entries of
    torch.Generator | None. impl: "auto" | "reference" | "triton".
    """
    layout = RaggedLayout.build(num_draft_tokens)
    draft_token_ids = draft_token_ids.reshape(-1).to(torch.int64)
    _validate(target_probs, draft_token_ids, layout, draft_probs, generators)
    device = target_probs.device
    vocab = target_probs.shape[1]
    greedy_host = _host_bools(is_greedy, layout.batch_size, "is_greedy")
    sampled_rows = [i for i, g in enumerate(greedy_host.tolist()) if not g]

    # all randomness first, in a fixed order per generator: uniforms, then noise
    uniforms = draw_uniforms(layout, sampled_rows, generators, device) if sampled_rows else None
    exps = draw_exponentials(layout.batch_size, vocab, generators, device, rows=sampled_rows) if sampled_rows else None
    target_argmax = target_probs.argmax(dim=-1) if len(sampled_rows) < layout.batch_size else None  # [T]

    args = (target_probs, draft_token_ids, layout, draft_probs, greedy_host, uniforms, exps, target_argmax)
    if _use_triton(device, impl):
        from kernels.triton_rejection import rejection_sample_triton

        return rejection_sample_triton(*args)
    return rejection_sample_reference(*args)


def rejection_sample_reference(
    target_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    layout: RaggedLayout,
    draft_probs: DraftProbs,
    greedy_host: torch.Tensor,
    uniforms: Optional[torch.Tensor],
    exps: Optional[torch.Tensor],
    target_argmax: Optional[torch.Tensor],
) -> RejectionResult:
    """Plain PyTorch rejection sampler over pre-drawn random numbers (no per-row Python loops)."""
    # target_probs: [T, V]; draft_token_ids: [D]; uniforms: [D]; exps: [B, V]; target_argmax: [T]
    device = target_probs.device
    b, max_k, vocab = layout.batch_size, layout.max_k, target_probs.shape[1]
    any_sampled = exps is not None
    any_greedy = target_argmax is not None
    greedy = greedy_host.to(device, non_blocking=True)  # [B]
    k = layout.num_draft_tokens.to(device, non_blocking=True)  # [B]
    out = torch.full((b, max_k + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int64, device=device)

    if max_k > 0:
        draft_idx, target_idx, valid = (t.to(device, non_blocking=True) for t in layout.padded_indices())
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
        out[:, :max_k] = torch.where(j < num_accepted.unsqueeze(1), d, torch.full_like(d, PLACEHOLDER_TOKEN_ID))
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
            # residual max(0, p - q); zero everywhere only through rounding (p == q), then fall back to p
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


def typical_acceptance_sample(
    target_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    is_greedy: Union[torch.Tensor, Sequence[bool]],
    generators: Sequence[Optional[torch.Generator]],
    posterior_threshold: float = 0.09,
    posterior_alpha: float = 0.3,
) -> RejectionResult:
    """Typical acceptance (Medusa): NOT lossless; trades exactness for acceptance rate.

    A sampled row accepts d_j iff p_j(d_j) > min(posterior_threshold, posterior_alpha * exp(-H(p_j))),
    H the entropy of p_j: confident (low-entropy) targets demand a high probability, flat ones accept
    anything plausible. At the first rejection (or after all drafts) one token is sampled from the
    target row itself (no residual). Greedy rows behave exactly as in `rejection_sample`. The
    output format and the per-row generator rules are those of `rejection_sample`; no uniforms are
    drawn (acceptance is deterministic given p).
    """
    layout = RaggedLayout.build(num_draft_tokens)
    draft_token_ids = draft_token_ids.reshape(-1).to(torch.int64)
    _validate(target_probs, draft_token_ids, layout, None, generators)
    device = target_probs.device
    b, max_k, vocab = layout.batch_size, layout.max_k, target_probs.shape[1]
    greedy_host = _host_bools(is_greedy, b, "is_greedy")
    sampled_rows = [i for i, g in enumerate(greedy_host.tolist()) if not g]
    exps = draw_exponentials(b, vocab, generators, device, rows=sampled_rows) if sampled_rows else None
    greedy = greedy_host.to(device, non_blocking=True)
    target_argmax = target_probs.argmax(dim=-1)  # [T]
    out = torch.full((b, max_k + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int64, device=device)

    if max_k > 0:
        draft_idx, target_idx, valid = (t.to(device, non_blocking=True) for t in layout.padded_indices())
        d = draft_token_ids[draft_idx]  # [B, max_k]
        p = target_probs[target_idx].to(torch.float32)  # [B, max_k, V]
        # entropy H = -sum p log p (0 log 0 = 0)
        entropy = -(p * torch.log(p.clamp(min=1e-30))).sum(dim=-1)  # [B, max_k]
        threshold = torch.minimum(
            torch.full_like(entropy, posterior_threshold), posterior_alpha * torch.exp(-entropy)
        )
        p_d = p.gather(2, d.unsqueeze(2)).squeeze(2)
        accept = torch.where(greedy.unsqueeze(1), d == target_argmax[target_idx], p_d > threshold) & valid
        num_accepted = accept.to(torch.int64).cumprod(dim=1).sum(dim=1)
        j = torch.arange(max_k, device=device)
        out[:, :max_k] = torch.where(j < num_accepted.unsqueeze(1), d, torch.full_like(d, PLACEHOLDER_TOKEN_ID))
    else:
        num_accepted = torch.zeros(b, dtype=torch.int64, device=device)

    extra_rows = layout.target_offsets.to(device, non_blocking=True) + num_accepted
    extra = target_argmax[extra_rows]
    if exps is not None:
        sampled = (target_probs[extra_rows].to(torch.float32) / exps).argmax(dim=1)
        extra = torch.where(greedy, extra, sampled)
    out.scatter_(1, num_accepted.unsqueeze(1), extra.unsqueeze(1))
    return RejectionResult(output_token_ids=out, num_accepted=num_accepted)
