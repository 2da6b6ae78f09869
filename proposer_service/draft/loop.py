"""The draft model's drafting loop: kmax autoregressive iterations over a batch of rows, each
choosing one draft token per row (proposer_service/sampling.py) and feeding it back.

The caller owns the batch cache: `forward(ids, pos, j)` runs iteration j over it and returns the
logits of each row's next token. Iteration 0 feeds the caller's first ids (a row's catch-up
tokens, or one token per row); iteration j > 0 feeds each row's d_j. A row's d_{j+1} sits at
position first_pos + j and is keyed by it (seeded sampling), so a row drafts the same tokens
whatever batch it is drafted in.

The loop never reads the device: tokens are chosen on it (a DraftChooser prepares every
iteration's host decisions and random numbers up front) and fed back where they are; the drafts,
their q and the alternatives come back in one copy after the last iteration.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from kernels.sparse_probs import SparseProbs
from proposer_service.sampling import DraftChooser, Row, draft_keys, logit_offsets
from splitspec.device import HostFetch
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
               cancel: threading.Event | None = None, guess_row: int | None = None,
               fetch: HostFetch | None = None) -> Drafted | None:
    """Draft kmax tokens per row, starting from ids, pos [B, S] (iteration 0's input) with d1 of
    row i at position first_pos[i]. The first token of row `guess_row` is a guess of what the
    verifier emits, not a draft (the bonus token of the all-accepted outcome): for an unseeded
    row it is the mode, the likelier guess than a sample (a seeded row keeps the keyed choice,
    the verifier's own rule applied to q). None once cancel is set. fetch: the caller's
    HostFetch (its pinned buffer reused), else a new one."""
    b, device = len(params), ids.device
    keys = [draft_keys(params, [p + j for p in first_pos]) for j in range(kmax)]
    chooser: DraftChooser | None = None
    offsets = None  # [B, V]: the rows' logit bias and allowed ids, once the vocabulary is known
    d1_pos = torch.tensor(first_pos).to(device, non_blocking=True)  # [B]
    tokens, alt_ids, alt_probs, q_ids, q_probs = [], [], [], [], []
    for j in range(kmax):
        if cancel is not None and cancel.is_set():
            return None
        logits = forward(ids, pos, j).float()  # [B, V]
        if chooser is None:
            chooser = DraftChooser(params, keys, top_k, logits.shape[-1], device, guess_row)
            offsets = logit_offsets(params, logits.shape[-1], device)
        if offsets is not None:
            logits = logits + offsets
        picked, q = chooser(logits, j)  # [B], on the device
        top = logits.softmax(dim=-1).topk(min(ALTERNATIVES, logits.shape[-1]), dim=-1)
        tokens.append(picked)
        alt_ids.append(top.indices)
        alt_probs.append(top.values)
        if q is not None:
            q_ids.append(q[0])
            q_probs.append(q[1])
        ids = picked[:, None]  # [B, 1]: fed back on the device
        pos = (d1_pos + j)[:, None]  # [B, 1]: d_{j+1}'s position
    if chooser is None:
        return Drafted([[] for _ in range(b)], [[] for _ in range(b)], [[] for _ in range(b)])
    # one copy out: [B, kmax] tokens, [B, kmax, A] alternatives, [kmax, n, K] q
    ints = [torch.stack(tokens, 1), torch.stack(alt_ids, 1)] + (
        [torch.stack(q_ids)] if q_ids else [])
    floats = [torch.stack(alt_probs, 1)] + ([torch.stack(q_probs)] if q_probs else [])
    fetch = fetch or HostFetch(device)
    (tok_h, alt_h, *qi_h), (altp_h, *qp_h) = fetch(ints, floats)
    tok_h, alt_h, altp_h = tok_h.tolist(), alt_h.tolist(), altp_h.tolist()
    out = Drafted([tok_h[i] for i in range(b)], [[] for _ in range(b)],
                  [[(alt_h[i][j], altp_h[i][j]) for j in range(kmax)] for i in range(b)])
    qi_h = qi_h[0].tolist() if qi_h else None
    qp_h = qp_h[0].tolist() if qp_h else None
    for j in range(kmax):
        rows = chooser.rows_q(qi_h[j], qp_h[j]) if qi_h is not None else [None] * b
        for i in range(b):
            out.dists[i].append(rows[i])
    return out
