"""Attention of a few query rows over a context that lies in a few runs of consecutive cache
slots, read in place: no gather.

A lone sequence's context is its blocks' slots, column after column. When its blocks are one
run of consecutive ids the context is one slice of the cache; a sequence that took a cached
prefix's blocks has (at least) two: the shared prefix, then its own blocks. Gathering the
context into one tensor copies every key and value of every layer at every step; here each run
is a view of the cache, attended to on its own, and the runs' partial results are combined
through their softmax statistics (split-KV attention, as flash-decoding splits a long context
and cascade attention splits a shared prefix from each sequence's suffix):

    run r, query row i:  m_r = max_c s_ic,  l_r = sum_c exp(s_ic - m_r),
                         o_r = sum_c exp(s_ic - m_r) v_c          (c over the run's columns)
    out_i = sum_r exp(m_r - M) o_r / sum_r exp(m_r - M) l_r,      M = max_r m_r

which is softmax(s_i) @ v over the whole context up to float rounding. Subtracting M keeps
every exponent at most 0 (large logits would overflow otherwise); a run a row sees nothing of
(m_r = -inf) weighs exactly 0.

Grouped-query heads are folded into the rows: the Hq / Hkv query heads that share a key/value
head become that head's rows, so one product per run and kv head serves them all and no key or
value is repeated. `slot_runs` finds the runs of a block table (host side, numpy).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["attention_over_runs", "combine_runs", "slot_runs"]

Run = tuple[int, int]  # (first slot, columns)


def slot_runs(blocks: np.ndarray, context_len: int, block_size: int) -> tuple[Run, ...]:
    """The runs of consecutive slots that a sequence's first `context_len` columns occupy,
    in column order, through its block ids `blocks` (column c: blocks[c // bs] * bs + c % bs)."""
    if context_len <= 0:
        return ()
    used = np.asarray(blocks[:-(-context_len // block_size)], dtype=np.int64)
    breaks = np.flatnonzero(np.diff(used) != 1) + 1  # the blocks that start a new run
    firsts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [len(used)]])
    runs = []
    for a, b in zip(firsts.tolist(), ends.tolist()):
        columns = min(b * block_size, context_len) - a * block_size
        runs.append((int(used[a]) * block_size, columns))
    return tuple(runs)


def attention_over_runs(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        runs: Sequence[Run], scale: float,
                        mask: torch.Tensor | None = None, mask_from: int = 0) -> torch.Tensor:
    """q [Hq, Q, D] (Hq a multiple of Hkv); k_cache, v_cache [slots, Hkv, D]; runs: (first
    slot, columns) in column order, the context being their concatenation (sum of columns);
    mask [Q, context] bool, True where a row sees a column (None: every row sees every column);
    mask_from: every row sees the columns before it (a run that ends there is not masked: a
    sequence's cached columns, for rows that are all fed after them). Every row must see at
    least one column. Returns [Hq, Q, D] in q's dtype."""
    hq, nq, d = q.shape
    hkv = k_cache.shape[1]
    g = hq // hkv
    rows = (q * scale).reshape(hkv, g * nq, d)  # kv head h's rows: its query heads' queries
    parts = []
    col = 0
    for first, n in runs:
        k = _as(k_cache[first:first + n], q.dtype).permute(1, 2, 0)  # [Hkv, D, n], a view
        v = _as(v_cache[first:first + n], q.dtype).transpose(0, 1)  # [Hkv, n, D]
        s = torch.matmul(rows, k)  # [Hkv, G * Q, n]
        masked = mask is not None and col + n > mask_from
        if masked:
            seen = mask[:, col:col + n]  # [Q, n], the same for every head of the group
            s = s.view(hkv, g, nq, n).masked_fill(~seen, float("-inf")).view(hkv, g * nq, n)
        parts.append(_partial(s, v, masked))
        col += n
    return combine_runs(parts).view(hq, nq, d)


def _partial(s: torch.Tensor, v: torch.Tensor, masked: bool
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One run's (o unnormalised [.., D], m [.., 1], l [.., 1]) from its scores s [.., n]."""
    m = s.amax(-1, keepdim=True)
    shift = m.masked_fill(m == float("-inf"), 0.0) if masked else m  # a row that sees none
    p = torch.exp(s - shift)
    return torch.matmul(p, v), m, p.sum(-1, keepdim=True)


def combine_runs(parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
                 ) -> torch.Tensor:
    """The attention output from every run's (o, m, l): sum exp(m - M) o / sum exp(m - M) l."""
    if len(parts) == 1:
        o, _, total = parts[0]
        return o / total
    o = torch.stack([p[0] for p in parts])
    m = torch.stack([p[1] for p in parts])
    total = torch.stack([p[2] for p in parts])
    w = torch.exp(m - m.amax(0))  # each run's weight, at most 1; 0 for a run the row sees none of
    return (o * w).sum(0) / (total * w).sum(0)


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t if t.dtype == dtype else t.to(dtype)
