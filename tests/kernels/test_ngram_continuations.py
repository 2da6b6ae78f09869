"""n-gram continuations for draft trees == a naive count of every earlier match's continuation,
ranked by frequency then recency, on random and repetitive histories."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kernels.ngram import ngram_candidates, ngram_continuations


def naive_continuations(tokens: list[int], min_n: int, max_n: int, k: int,
                        max_candidates: int) -> list[tuple[list[int], int]]:
    """Every earlier end of the longest matching suffix, its k-token LZ77 copy, counted."""
    n_tok = len(tokens)
    if k <= 0:
        return []
    for n in range(min(max_n, n_tok - 1), min_n - 1, -1):
        suffix = tokens[n_tok - n:]
        ends = [j for j in range(n_tok - 1, n - 1, -1) if tokens[j - n:j] == suffix]
        if not ends:
            continue
        counts: dict[tuple[int, ...], int] = {}
        recency: dict[tuple[int, ...], int] = {}
        for rank, j in enumerate(ends):  # most recent first
            ext = list(tokens)
            for t in range(k):
                ext.append(ext[j + t])
            cont = tuple(ext[n_tok:])
            counts[cont] = counts.get(cont, 0) + 1
            recency.setdefault(cont, rank)
        ranked = sorted(counts, key=lambda c: (-counts[c], recency[c]))
        return [(list(c), counts[c]) for c in ranked[:max_candidates]]
    return []


def test_examples():
    # suffix [1, 2] ends at 2, 5 and 8; [3, 1] follows twice, [4, 1] once (the most recent)
    toks = [1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 2]
    assert ngram_continuations(toks, 1, 3, 2, 5) == [([3, 1], 2), ([4, 1], 1)]
    assert ngram_continuations(toks, 1, 3, 2, 1) == [([3, 1], 2)]
    # the chain keeps the most recent continuation, not the most frequent
    assert ngram_candidates(toks, 1, 3, 2) == [[4, 1]]
    assert ngram_continuations([1, 2, 3, 4], 1, 3, 2, 4) == []
    assert ngram_continuations(toks, 1, 3, 0, 4) == []
    assert ngram_continuations(toks, 1, 3, 2, 0) == []
    with pytest.raises(ValueError):
        ngram_continuations(toks, 2, 1, 2, 4)


@pytest.mark.parametrize("vocab", [2, 3, 8])
def test_matches_the_naive_count_on_random_histories(vocab):
    rng = random.Random(vocab)
    for _ in range(150):
        toks = [rng.randrange(vocab) for _ in range(rng.randrange(0, 60))]
        min_n = rng.randint(1, 3)
        max_n = rng.randint(min_n, 6)
        k, cands = rng.randint(1, 6), rng.randint(1, 8)
        assert ngram_continuations(toks, min_n, max_n, k, cands) == \
            naive_continuations(toks, min_n, max_n, k, cands), (toks, min_n, max_n, k, cands)


def test_many_occurrences_and_numpy_input():
    rng = random.Random(0)
    toks = [rng.choice([5, 5, 5, 6]) for _ in range(400)]  # very repetitive: hundreds of matches
    got = ngram_continuations(np.array(toks, dtype=np.int32), 1, 1, 4, 1000)
    assert got == naive_continuations(toks, 1, 1, 4, 1000)
    assert sum(c for _, c in got) == toks[:-1].count(toks[-1]) > 64  # every earlier match
