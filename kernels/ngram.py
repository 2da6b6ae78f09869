"""N-gram (prompt-lookup) matching: continuations of the longest earlier match of the history's
suffix.

Semantics of `ngram_candidates(tokens, min_n, max_n, k, max_candidates)`:
    L = the largest n, min_n <= n <= max_n and n < len(tokens), such that the suffix tokens[-n:]
        also ends at an earlier position j, i.e. tokens[j-n:j] == tokens[-n:] with n <= j < len
        (occurrences may overlap the suffix). No such n: return [].
    For every earlier end position j of the length-L suffix, most recent (largest j) first, the
    continuation is k tokens copied LZ77-style, c_t = ext[j + t] with ext = tokens + c; running
    past the end copies the continuation itself, so c_t = tokens[j + (t mod (len - j))] and a
    periodic pattern yields k tokens even from its most recent occurrence.
    Duplicate continuations are dropped; at most max_candidates are returned.

`ngram_continuations(tokens, min_n, max_n, k, max_candidates)`: the same continuations, each
distinct one once with its number of occurrences, ranked by that count (most frequent first),
then by recency of its most recent occurrence: what a draft tree branches over.

Matching works on the reversed history R = tokens[::-1]: the suffix of length n ending the history
is R's prefix of length n, and an earlier occurrence ending at j is an occurrence of that prefix
starting at s = len - j in R. So the match length at j is Z[s] = LCP(R, R[s:]) capped at max_n:
    - max_n <= _VECTOR_MAX_N (the common case, max_n ~ 1..8): extend all candidate starts one token
      at a time with numpy, keeping the survivors; O(n * min(L + 1, max_n)) vectorised work.
    - larger max_n: the Z-function, O(n) scalar steps.
"""

from __future__ import annotations

from typing import Sequence, Union

import numpy as np
import torch

__all__ = ["ngram_candidates", "ngram_continuations", "z_function"]

# above this max_n the scalar O(n) Z-function beats per-offset vectorised extension
_VECTOR_MAX_N = 64

TokenSeq = Union[Sequence[int], np.ndarray, torch.Tensor]


def _as_array(tokens: TokenSeq) -> np.ndarray:
    if isinstance(tokens, torch.Tensor):
        return tokens.detach().to("cpu", torch.int64).reshape(-1).numpy()
    return np.asarray(tokens, dtype=np.int64).reshape(-1)


def z_function(seq: np.ndarray, cap: int) -> np.ndarray:
    """z[s] = min(cap, LCP(seq, seq[s:])) for s >= 1 (z[0] = 0), in O(len(seq))."""
    s_list = seq.tolist()
    n = len(s_list)
    z = [0] * n
    left = right = 0  # [left, right) is the rightmost window known to match a prefix
    for i in range(1, n):
        zi = 0
        if i < right:
            zi = min(right - i, z[i - left])
        while i + zi < n and s_list[zi] == s_list[i + zi]:
            zi += 1
        z[i] = zi
        if i + zi > right:
            left, right = i, i + zi
    return np.minimum(np.asarray(z, dtype=np.int64), cap)


def _match_starts(rev: np.ndarray, max_n: int) -> tuple[int, np.ndarray]:
    """(L, starts): L = longest match (<= max_n) of rev's prefix at some s >= 1; starts
    ascending."""
    n = rev.shape[0]
    if max_n > _VECTOR_MAX_N:
        z = z_function(rev, max_n)
        best = int(z.max()) if n > 1 else 0
        return best, (np.nonzero(z >= best)[0] if best > 0 else np.empty(0, np.int64))
    starts = np.arange(1, n, dtype=np.int64)  # candidate starts s in R
    length = 0
    while length < max_n:
        fits = starts[starts + length < n]  # the window grown by one must fit inside R
        survivors = fits[rev[fits + length] == rev[length]]
        if survivors.size == 0:
            break
        starts = survivors
        length += 1
    return length, (starts if length > 0 else np.empty(0, np.int64))


def _continuations(tokens: TokenSeq, min_n: int, max_n: int, k: int,
                   most_recent: int | None = None) -> np.ndarray | None:
    """[S, k] int64: the continuation of every earlier match (of the `most_recent` ones when
    given), most recent first; None: no match (or nothing asked)."""
    if min_n < 1 or max_n < min_n:
        raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
    arr = _as_array(tokens)
    n = arr.shape[0]
    if k <= 0 or n < 2:
        return None
    rev = arr[::-1].copy()
    length, starts = _match_starts(rev, max_n)
    if length < min_n:
        return None
    # starts s ascending = end positions j = n - s descending (most recent first)
    starts = starts[:most_recent]
    ends = n - starts  # [S]
    period = starts  # len - j
    t = np.arange(k, dtype=np.int64)
    # [S, k]: c_t = tokens[j + (t mod (len - j))]
    return arr[ends[:, None] + t[None, :] % period[:, None]]


def ngram_candidates(
    tokens: TokenSeq, min_n: int, max_n: int, k: int, max_candidates: int = 1
) -> list[list[int]]:
    """Up to max_candidates distinct k-token continuations of the longest earlier suffix match."""
    conts = _continuations(tokens, min_n, max_n, k, 1 if max_candidates == 1 else None)
    if conts is None or max_candidates <= 0:
        return []
    if max_candidates == 1:
        return [conts[0].tolist()]
    if conts.shape[0] > 64:
        # many occurrences (repetitive history): dedupe in one vectorised pass, keep recency order
        _, first = np.unique(conts, axis=0, return_index=True)
        first.sort()
        return [conts[i].tolist() for i in first[:max_candidates]]
    out: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    for row in conts.tolist():
        key = tuple(row)
        if key not in seen:
            seen.add(key)
            out.append(row)
            if len(out) == max_candidates:
                break
    return out


def ngram_continuations(
    tokens: TokenSeq, min_n: int, max_n: int, k: int, max_candidates: int
) -> list[tuple[list[int], int]]:
    """Up to max_candidates distinct k-token continuations with their occurrence counts, most
    frequent first, ties to the most recent."""
    conts = _continuations(tokens, min_n, max_n, k)
    if conts is None or max_candidates <= 0:
        return []
    uniq, first, counts = np.unique(conts, axis=0, return_index=True, return_counts=True)
    order = np.lexsort((first, -counts))[:max_candidates]  # by -count, then first (recency)
    return [(uniq[i].tolist(), int(counts[i])) for i in order]
