"""The draft model's drafting loop: kmax autoregressive iterations over a batch of rows, each
choosing one draft token per row (proposer_service/draft_sampling.py) and feeding it back.

The caller owns the batch cache: `forward(ids, pos, j)` runs iteration j over it and returns the
logits of each row's next token. Iteration 0 feeds the caller's first ids (a row's catch-up
tokens, or one token per row); iteration j > 0 feeds each row's d_j. A row's d_{j+1} sits at
position first_pos + j and is keyed by it (seeded sampling), so a row drafts the same tokens
whatever batch it is drafted in.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from kernels.sparse_probs import SparseProbs
from proposer_service.draft_sampling import Row, choose_tokens, draft_keys
from splitspec.params import SamplingParams
from splitspec.proposal import Draft

# ids, pos [B, S], iteration j -> logits of each row's next token [B, V]
Forward = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
Alternatives = tuple[list[int], list[float]]  # the likeliest tokens and their probabilities
ALTERNATIVES = 4  # how many of the likeliest tokens are kept per drafted position


@dataclass
class Drafted:
    """What the loop drafted, per row and position: the token, the sparse q it was drawn from
    (None: greedy), and the draft model's ALTERNATIVES likeliest tokens there (its guesses of
    the recovered token, should the verifier reject that draft token, and a tree's leaves)."""

    tokens: list[list[int]]
    dists: list[list[Row | None]]
    alternatives: list[list[Alternatives]]

    def draft(self, row: int, seq_id: str, k: int) -> Draft:
        """The row's first k tokens as a draft, with their q when sampled."""
        dists = self.dists[row][:k]
        return Draft(seq_id, self.tokens[row][:k],
                     q=SparseProbs.from_rows(dists) if dists[0] is not None else None)


def draft_loop(forward: Forward, ids: torch.Tensor, pos: torch.Tensor, first_pos: list[int],
               params: Sequence[SamplingParams], kmax: int, top_k: int,
               cancel: threading.Event | None = None, guess_row: int | None = None
               ) -> Drafted | None:
    """Draft kmax tokens per row, starting from ids, pos [B, S] (iteration 0's input) with d1 of
    row i at position first_pos[i]. The first token of row `guess_row` is a guess of what the
    verifier emits, not a draft (the bonus token of the all-accepted outcome): for an unseeded
    row it is the mode, the likelier guess than a sample (a seeded row keeps the keyed choice,
    the verifier's own rule applied to q). None once cancel is set."""
    b = len(params)
    out = Drafted([[] for _ in range(b)], [[] for _ in range(b)], [[] for _ in range(b)])
    d1_pos = torch.tensor(first_pos, device=ids.device)  # [B]
    for j in range(kmax):
        if cancel is not None and cancel.is_set():
            return None
        logits = forward(ids, pos, j).float()  # [B, V]
        keys = draft_keys(params, [p + j for p in first_pos])
        picked, dists = choose_tokens(logits, params, keys, top_k)
        if j == 0 and guess_row is not None and keys[guess_row] is None:
            picked[guess_row] = int(logits[guess_row].argmax())
        top = logits.softmax(dim=-1).topk(min(ALTERNATIVES, logits.shape[-1]), dim=-1)
        for i, (t, d, a) in enumerate(zip(picked, dists, zip(top.indices.tolist(),
                                                             top.values.tolist()))):
            out.tokens[i].append(t)
            out.dists[i].append(d)
            out.alternatives[i].append(a)
        ids = torch.tensor(picked, dtype=torch.long, device=ids.device)[:, None]  # [B, 1]
        pos = (d1_pos + j)[:, None]  # [B, 1]: d_{j+1}'s position
    return out
