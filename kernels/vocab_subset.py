"""An output head that scores only a subset of the vocabulary (frequency-ranked, as in FR-Spec).

A drafter's output head multiplies its hidden state by one row per vocabulary token. On a large
vocabulary that product dominates a small drafter's step (SmolLM2's 49,152 tokens x 256 hidden is
12.6 M multiply-adds per drafted token, four times the rest of its 16 M-parameter draft), yet
most of those tokens are almost never what the target says next. Scoring only the N most
frequent tokens cuts the head by V / N; tokens outside the subset get logit -inf, so the draft
never proposes them. That is lossless: verification accepts or rejects every drafted token
against the target, and a sampled draft's q is exactly the distribution it drew from (zero
outside the subset). Only acceptance can change, where the target says a rare token.
"""

from __future__ import annotations

import torch

from kernels.linear import PackedLinear


def subset_ids(ranked: list[int], n: int, vocab_size: int) -> torch.Tensor:
    """The first n distinct ids of `ranked` (most frequent first), as a sorted int64 tensor.
    ValueError for ids outside [0, vocab_size) or fewer than n ranked ids."""
    if n < 1:
        raise ValueError(f"vocabulary subset size must be >= 1, got {n}")
    seen: dict[int, None] = {}
    for t in ranked:
        if not 0 <= t < vocab_size:
            raise ValueError(f"token id {t} is outside the vocabulary of {vocab_size}")
        seen.setdefault(int(t), None)
        if len(seen) == n:
            break
    if len(seen) < n:
        raise ValueError(f"only {len(seen)} ranked tokens for a subset of {n}")
    return torch.tensor(sorted(seen), dtype=torch.long)


def scatter_logits(sub: torch.Tensor, ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """sub [..., N] logits of tokens ids [N] -> [..., vocab_size], -inf at every other token."""
    out = sub.new_full((*sub.shape[:-1], vocab_size), float("-inf"))
    out.index_copy_(-1, ids.to(sub.device), sub)
    return out


class SubsetHead:
    """Logits over the whole vocabulary from a head computed on the rows `ids` of `weight`
    [V, H] only (packed once for `backend`, kernels/linear.py); -inf elsewhere. A drafter's
    head: its rows need not be batch invariant (PackedLinear's `invariant`)."""

    __slots__ = ("ids", "vocab_size", "linear")

    def __init__(self, weight: torch.Tensor, ids: torch.Tensor, backend: str,
                 invariant: bool = False):
        self.vocab_size = weight.shape[0]
        self.ids = ids.to(weight.device)
        self.linear = PackedLinear(weight.detach().index_select(0, self.ids), None, backend,
                                   invariant)

    @property
    def weight(self) -> torch.Tensor:
        return self.linear.weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return scatter_logits(self.linear(x), self.ids, self.vocab_size)


class SubsetHeadModule(torch.nn.Module):
    """A SubsetHead standing in for an nn.Linear head inside a module (inference only)."""

    def __init__(self, head: SubsetHead):
        super().__init__()
        self.subset = head

    @property
    def weight(self) -> torch.Tensor:
        return self.subset.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.subset(x)
