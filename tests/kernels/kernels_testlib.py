"""Shared helpers for the kernels tests: random ragged batches and naive per-row oracles."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from kernels.rejection import SparseProbs
from kernels.sampling import keyed_exponentials, noise_key


@dataclass
class RaggedBatch:
    target_probs: torch.Tensor  # [T, V]
    draft_token_ids: torch.Tensor  # [D]
    num_draft_tokens: torch.Tensor  # [B]
    draft_probs: object  # None | dense [D, V] | SparseProbs
    is_greedy: torch.Tensor  # [B]


def random_probs(
    rows: int, vocab: int, gen: torch.Generator, sharpness: float = 1.0
) -> torch.Tensor:
    return torch.softmax(torch.randn(rows, vocab, generator=gen) * sharpness, dim=-1)


def random_sparse(rows: int, vocab: int, top: int, gen: torch.Generator) -> SparseProbs:
    idx = (
        torch.stack([torch.randperm(vocab, generator=gen)[:top] for _ in range(rows)])
        if rows
        else torch.zeros(0, top, dtype=torch.long)
    )
    probs = torch.softmax(torch.randn(rows, top, generator=gen), dim=-1)
    return SparseProbs(indices=idx, probs=probs)


def sample_rows(probs: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    if probs.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long)
    return torch.multinomial(probs, 1, generator=gen).squeeze(1)


def random_batch(
    ks: list[int],
    vocab: int,
    mode: str,
    gen: torch.Generator,
    greedy: Optional[list[bool]] = None,
    top: int = 4,
    sharpness: float = 2.0,
) -> RaggedBatch:
    """A ragged batch whose drafts really are samples of the draft distribution."""
    b, d = len(ks), sum(ks)
    target = random_probs(d + b, vocab, gen, sharpness)
    if mode == "none":
        draft_probs = None
        draft_ids = torch.randint(vocab, (d,), generator=gen)
    elif mode == "dense":
        draft_probs = random_probs(d, vocab, gen, sharpness)
        draft_ids = sample_rows(draft_probs, gen)
    elif mode == "sparse":
        draft_probs = random_sparse(d, vocab, top, gen)
        pick = sample_rows(draft_probs.probs, gen) if d else torch.zeros(0, dtype=torch.long)
        draft_ids = draft_probs.indices.gather(1, pick.unsqueeze(1)).squeeze(1) if d else pick
    else:
        raise ValueError(mode)
    greedy_t = torch.tensor(greedy if greedy is not None else [False] * b, dtype=torch.bool)
    return RaggedBatch(target, draft_ids, torch.tensor(ks, dtype=torch.long), draft_probs, greedy_t)


def dense_q(draft_probs, draft_ids: torch.Tensor, vocab: int) -> torch.Tensor:
    if draft_probs is None:
        return torch.nn.functional.one_hot(draft_ids, vocab).to(torch.float32)
    if isinstance(draft_probs, SparseProbs):
        return draft_probs.to_dense(vocab)
    return draft_probs.to(torch.float32)


def naive_rejection_row(
    p_rows: torch.Tensor,  # [k + 1, V]
    drafts: list[int],
    q_rows: torch.Tensor,  # [k, V] dense
    greedy: bool,
    u: Optional[torch.Tensor],  # [k] acceptance uniforms (sampled rows)
    exps: Optional[torch.Tensor],  # [V] Exp(1) noise for the extra token (sampled rows)
) -> list[int]:
    """One unseeded sequence, written as the textbook loop over given random numbers."""
    k = len(drafts)
    if greedy:
        out = []
        for j, d in enumerate(drafts):
            best = int(torch.argmax(p_rows[j]))
            if d != best:
                return out + [best]
            out.append(d)
        return out + [int(torch.argmax(p_rows[k]))]
    out = []
    for j, d in enumerate(drafts):
        if bool(u[j] * q_rows[j, d] < p_rows[j, d]):  # float32, as the kernels compare
            out.append(d)
            continue
        r = (p_rows[j] - q_rows[j]).clamp(min=0)
        if not bool((r > 0).any()):
            r = p_rows[j]
        return out + [int(torch.argmax(r / exps))]
    return out + [int(torch.argmax(p_rows[k] / exps))]


def naive_coupled_row(
    p_rows: torch.Tensor, drafts: list[int], seed: int, first_pos: int
) -> list[int]:
    """One seeded sequence as the textbook loop: the token at position t is the keyed sample
    argmax(p_t / E(seed, t)); a draft is accepted iff it equals it."""
    out = []
    for j in range(len(drafts) + 1):
        key = noise_key(seed, first_pos + j)
        e = keyed_exponentials([key], torch.arange(p_rows.shape[1])[None])[0]
        g = int(torch.argmax(p_rows[j] / e))
        out.append(g)
        if j == len(drafts) or drafts[j] != g:
            return out
    return out
