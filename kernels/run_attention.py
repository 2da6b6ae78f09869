"""Attention of a few query rows over a context that lies in a few runs of consecutive cache
slots, read in place: no gather.

A lone sequence's context is its blocks' slots, column after column. When its blocks are one
run of consecutive ids the context is one slice of the cache; a sequence that took a cached
prefix's blocks has (at least) two: the shared prefix, then its own blocks. Gathering the
context into one tensor copies every key and value of every layer at every step. Here each
run's keys and values stay views of the cache (split-KV attention, as cascade attention splits a
shared prefix from each sequence's suffix):

    s = [q K_1^T | q K_2^T | ...] * scale     the runs' scores side by side, [rows, context]
    p = softmax(s)                            one softmax over the whole row
    out = p[:, run 1] V_1 + p[:, run 2] V_2 + ...

Only the scores (a few rows by the context) are written; for a handful of rows that is far less
than the keys and values a gather copies, and the softmax is the plain one over the whole row:
no per-run maxima and sums to combine (flash-decoding's log-sum-exp merge, which pays a dozen
small operations per layer that cost more than they save at these sizes on a CPU).

Grouped-query heads are folded into the rows: the Hq / Hkv query heads that share a key/value
head become that head's rows, so one product per run and kv head serves them all and no key or
value is repeated. `slot_runs` finds the runs of a block table (host side, numpy).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["attention_over_runs", "slot_runs", "weigh_runs"]

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
    mask_from: every row sees the columns before it, whose mask is not read (a sequence's
    cached columns, for rows that are all fed after them). Every row must see at least one
    column. Returns [Hq, Q, D] in q's dtype."""
    hq, nq, d = q.shape
    hkv = k_cache.shape[1]
    g = hq // hkv
    rows = (q * scale).reshape(hkv, g * nq, d)  # kv head h's rows: its query heads' queries
    s = torch.cat([torch.matmul(rows, _as(k_cache[first:first + n], q.dtype).permute(1, 2, 0))
                   for first, n in runs], -1)  # [Hkv, G * Q, context]; keys read as views
    if mask is not None and mask_from < s.shape[-1]:
        hidden = ~mask[:, mask_from:]  # [Q, columns], the same for every head of the group
        s.view(hkv, g, nq, -1)[..., mask_from:].masked_fill_(hidden, float("-inf"))
    return weigh_runs(torch.softmax(s, -1), v_cache, runs).view(hq, nq, d)


def weigh_runs(p: torch.Tensor, v_cache: torch.Tensor, runs: Sequence[Run]) -> torch.Tensor:
    """p [Hkv, rows, context] (probabilities) times the runs' values: [Hkv, rows, D]."""
    out, col = None, 0
    for first, n in runs:
        v = _as(v_cache[first:first + n], p.dtype).transpose(0, 1)  # [Hkv, n, D], a view
        part = p[..., col:col + n]
        out = torch.matmul(part, v) if out is None else torch.baddbmm(out, part, v)
        col += n
    return out


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t if t.dtype == dtype else t.to(dtype)
