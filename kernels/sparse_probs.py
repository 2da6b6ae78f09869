"""A draft distribution restricted to the K tokens it can emit: the one type for q, from the
proposer that sampled a draft through the wire to the rejection sampler."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

__all__ = ["SparseProbs"]


@dataclass
class SparseProbs:
    """q restricted to K tokens per row.

    indices: int64 [M, K]; probs: float [M, K], each row sums to 1. Padding entries (rows of
    different widths packed together) have probability 0, so a repeated index adds nothing.
    A one-hot draft (n-gram proposer, greedy draft model) is SparseProbs with K = 1 and prob 1.0,
    which is how deterministic and sampled drafts share one verifier batch.
    """

    indices: torch.Tensor  # int64 [M, K]
    probs: torch.Tensor  # float [M, K]

    def __post_init__(self) -> None:
        if self.indices.dim() != 2 or self.indices.shape != self.probs.shape:
            raise ValueError(
                f"SparseProbs wants indices and probs of one [M, K] shape, got "
                f"{tuple(self.indices.shape)} and {tuple(self.probs.shape)}")

    @classmethod
    def one_hot(cls, token_ids: torch.Tensor) -> "SparseProbs":
        """The deterministic draft distribution at token_ids [M] (K = 1, prob 1)."""
        idx = token_ids.reshape(-1, 1).to(torch.int64)
        return cls(indices=idx,
                   probs=torch.ones(idx.shape, dtype=torch.float32, device=idx.device))

    @classmethod
    def from_rows(cls, rows: Sequence[tuple[Sequence[int], Sequence[float]]]) -> "SparseProbs":
        """Rows of (indices, probs) of any widths, packed to the widest with zero-prob padding."""
        width = max((len(i) for i, _ in rows), default=1)
        indices = torch.zeros(len(rows), width, dtype=torch.int64)
        probs = torch.zeros(len(rows), width, dtype=torch.float32)
        for r, (idx, p) in enumerate(rows):
            indices[r, :len(idx)] = torch.as_tensor(idx, dtype=torch.int64)
            probs[r, :len(p)] = torch.as_tensor(p, dtype=torch.float32)
        return cls(indices, probs)

    @classmethod
    def cat(cls, parts: Sequence["SparseProbs"]) -> "SparseProbs":
        """Stack the rows of several SparseProbs, padding each to the widest."""
        width = max(p.indices.shape[1] for p in parts)

        def pad(t: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.pad(t, (0, width - t.shape[1]))

        return cls(torch.cat([pad(p.indices) for p in parts]),
                   torch.cat([pad(p.probs.to(torch.float32)) for p in parts]))

    @property
    def num_rows(self) -> int:
        return self.indices.shape[0]

    def rows(self) -> list[tuple[list[int], list[float]]]:
        """(indices, probs) per row as Python lists, padding dropped (the wire's form)."""
        out = []
        for idx, p in zip(self.indices.tolist(), self.probs.tolist()):
            keep = [j for j, v in enumerate(p) if v > 0]
            out.append(([idx[j] for j in keep], [p[j] for j in keep]))
        return out

    def prob_of(self, token_ids: torch.Tensor) -> torch.Tensor:
        """q(token_ids[m]) for each row m -> float32 [M]."""
        hit = self.indices == token_ids.reshape(-1, 1)
        return torch.where(hit, self.probs.to(torch.float32), 0.0).sum(-1)

    def to(self, device: torch.device) -> "SparseProbs":
        return SparseProbs(self.indices.to(device, non_blocking=True),
                           self.probs.to(device, non_blocking=True))

    def to_dense(self, vocab_size: int) -> torch.Tensor:
        """Dense [M, V] float32 probabilities."""
        dense = torch.zeros(self.num_rows, vocab_size, dtype=torch.float32,
                            device=self.probs.device)
        return dense.scatter_add_(1, self.indices, self.probs.to(torch.float32))
