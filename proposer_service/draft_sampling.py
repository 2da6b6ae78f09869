"""How the learned proposers (draft model, MLP speculator) turn draft logits into draft tokens.

Greedy requests (temperature 0): argmax, sent as token ids only (one-hot). Sampled requests:
q = apply_sampling_params(draft logits, the request's own temperature/top-k/top-p/min-p), the same
processing the verifier applies to the target's p; q is truncated to its top-K entries and
renormalised, the token is drawn from that truncated q, and exactly that sparse q is sent, so
rejection sampling stays lossless (truncation costs acceptance, never correctness).

Seeded requests draw with the verifier's keyed noise (kernels.sampling.noise_key): the draft for
position t is argmax(q / E(seed, t)) over q's support, E at those very token ids. The verifier
emits argmax(p / E(seed, t)) for a seeded request whatever is drafted, so the shared noise is what
makes the two agree when q is close to p; and a draft depends only on (seed, position), never on
restarts, resyncs or batch composition.
"""

from __future__ import annotations

from typing import Sequence

import torch

from kernels.sampling import apply_sampling_params, keyed_exponentials, noise_key, sample
from splitspec.params import SamplingParams

Row = tuple[list[int], list[float]]  # one draft token's sparse q: (token ids, probabilities)


def draft_keys(params: Sequence[SamplingParams], positions: Sequence[int]) -> list[int | None]:
    """The noise key of each row's next draft token (None: greedy or unseeded)."""
    return [None if p.greedy or p.seed is None else noise_key(p.seed, pos)
            for p, pos in zip(params, positions)]


def choose_tokens(logits: torch.Tensor, params: Sequence[SamplingParams],
                  keys: Sequence[int | None], top_k: int) -> tuple[list[int], list[Row | None]]:
    """One draft token per row of logits [B, V], and the sparse q it was drawn from (None for
    greedy rows)."""
    # logits: [B, V]
    tokens = logits.argmax(dim=-1).tolist()
    rows_q: list[Row | None] = [None] * len(params)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rows:
        return tokens, rows_q
    sel = [params[i] for i in rows]
    q = apply_sampling_params(
        logits[rows].float(),
        torch.tensor([p.temperature for p in sel], dtype=torch.float32),
        torch.tensor([p.top_k for p in sel], dtype=torch.int64),
        torch.tensor([p.top_p for p in sel], dtype=torch.float32),
        torch.tensor([p.min_p for p in sel], dtype=torch.float32))  # [n, V]
    vals, idx = q.topk(min(top_k, q.shape[-1]), dim=-1)  # [n, K]
    vals = vals / vals.sum(dim=-1, keepdim=True)  # the truncated q the token is drawn from
    picks = sample(vals)  # [n] positions into the top-K, default RNG
    keyed = [r for r, i in enumerate(rows) if keys[i] is not None]
    if keyed:
        noise = keyed_exponentials([keys[rows[r]] for r in keyed], idx[keyed])  # at the ids
        picks[keyed] = (vals[keyed] / noise).argmax(dim=-1)
    for r, i in enumerate(rows):
        keep = vals[r] > 0
        tokens[i] = int(idx[r, picks[r]])
        rows_q[i] = (idx[r][keep].tolist(), vals[r][keep].tolist())
    return tokens, rows_q
