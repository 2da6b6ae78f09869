"""n-gram matcher == a naive quadratic search, on random and highly repetitive histories."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
import torch

from kernels.ngram import ngram_candidates, z_function


def naive_ngram(
    tokens: list[int], min_n: int, max_n: int, k: int, max_candidates: int = 1
) -> list[list[int]]:
    """The documented semantics, written as directly as possible (quadratic)."""
    n_tok = len(tokens)
    if k <= 0 or max_candidates <= 0:
        return []
    for n in range(min(max_n, n_tok - 1), min_n - 1, -1):
        suffix = tokens[n_tok - n :]
        ends = [j for j in range(n_tok - 1, n - 1, -1) if tokens[j - n : j] == suffix]
        if not ends:
            continue
        out: list[list[int]] = []
        for j in ends:
            ext = list(tokens)
            cont = []
            for t in range(k):
                ext.append(ext[j + t])
                cont.append(ext[j + t])
            if cont not in out:
                out.append(cont)
            if len(out) == max_candidates:
                break
        return out
    return []


def test_examples():
    # suffix [1, 2] seen ending at j = 2 and j = 5: continuations from there, most recent first
    toks = [1, 2, 3, 1, 2, 4, 1, 2]
    assert ngram_candidates(toks, 1, 3, 2, max_candidates=3) == [[4, 1], [3, 1]]
    assert ngram_candidates(toks, 1, 3, 2) == [[4, 1]]
    # periodic history: the most recent occurrence overlaps the suffix and the copy runs on
    assert ngram_candidates([7, 8, 7, 8, 7, 8], 2, 4, 5) == [[7, 8, 7, 8, 7]]
    assert ngram_candidates([5, 5, 5, 5], 1, 3, 4, 3) == [[5, 5, 5, 5]]
    # no earlier occurrence of any allowed suffix
    assert ngram_candidates([1, 2, 3, 4], 1, 3, 2) == []
    assert ngram_candidates([1, 2, 3, 1], 2, 3, 2) == []  # only n = 1 would match
    assert ngram_candidates([], 1, 3, 2) == [] and ngram_candidates([4], 1, 3, 2) == []


def test_input_types():
    toks = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 1, 4, 1]
    expected = naive_ngram(toks, 1, 4, 3, 2)
    assert ngram_candidates(toks, 1, 4, 3, 2) == expected
    assert ngram_candidates(np.array(toks, dtype=np.int32), 1, 4, 3, 2) == expected
    assert ngram_candidates(torch.tensor(toks), 1, 4, 3, 2) == expected


def test_argument_validation():
    with pytest.raises(ValueError):
        ngram_candidates([1, 2], 0, 3, 1)
    with pytest.raises(ValueError):
        ngram_candidates([1, 2], 3, 2, 1)
    assert ngram_candidates([1, 1, 1], 1, 2, 0) == []


def _cases(rng: random.Random, n: int):
    for _ in range(n):
        length = rng.randint(0, 70)
        alphabet = rng.choice([1, 2, 3, 5, 50])
        toks = [rng.randrange(alphabet) for _ in range(length)]
        min_n = rng.randint(1, 4)
        max_n = rng.randint(min_n, 8)
        yield toks, min_n, max_n, rng.randint(1, 8), rng.choice([1, 2, 3, 10])


def test_random_histories_match_naive():
    rng = random.Random(0)
    for toks, min_n, max_n, k, m in _cases(rng, 1500):
        assert ngram_candidates(toks, min_n, max_n, k, m) == naive_ngram(
            toks, min_n, max_n, k, m
        ), (toks, min_n, max_n, k, m)


def _adversarial(rng: random.Random) -> list[list[int]]:
    fib = [[0], [0, 1]]
    while len(fib[-1]) < 150:
        fib.append(fib[-1] + fib[-2])
    hists = [
        [7] * 120,  # one symbol
        [1, 2] * 60,  # period 2
        [1, 2, 3] * 40 + [1, 2],  # period 3, cut mid-period
        [0] * 60 + [1] + [0] * 59,  # a single break
        ([4] * 9 + [5]) * 12,  # long runs
        fib[-1][:150],  # Fibonacci word: many near-repeats
        [rng.randrange(2) for _ in range(150)],
    ]
    # "abab...ab" with noise in the last few tokens
    noisy = [1, 2] * 60
    noisy[-3] = 9
    hists.append(noisy)
    return hists


@pytest.mark.parametrize("max_n", [1, 3, 8, 64, 65, 200])
def test_adversarial_histories_match_naive(max_n):
    # max_n > 64 exercises the Z-function path
    rng = random.Random(max_n)
    for hist in _adversarial(rng):
        for min_n in sorted({1, min(3, max_n), max_n}):
            for k, m in ((1, 1), (5, 3), (8, 20)):
                got = ngram_candidates(hist, min_n, max_n, k, m)
                assert got == naive_ngram(hist, min_n, max_n, k, m), (hist[:20], min_n, max_n, k, m)


def test_z_function_matches_definition():
    rng = random.Random(3)
    for _ in range(200):
        seq = np.array([rng.randrange(rng.choice([1, 2, 4])) for _ in range(rng.randint(1, 60))])
        z = z_function(seq, cap=10**9)
        for s in range(1, len(seq)):
            lcp = 0
            while s + lcp < len(seq) and seq[lcp] == seq[s + lcp]:
                lcp += 1
            assert z[s] == lcp


def test_long_repetitive_history_is_fast():
    # 32k tokens of one symbol: every position matches; must stay well away from quadratic time
    hist = np.full(32_000, 3, dtype=np.int64)
    t0 = time.perf_counter()
    assert ngram_candidates(hist, 1, 8, 8, 4) == [[3] * 8]
    periodic = np.tile(np.arange(7), 32_000 // 7)
    assert len(ngram_candidates(periodic, 2, 5, 8, 4)) == 1
    assert ngram_candidates(periodic, 2, 128, 8, 4) == [
        [int(x) for x in (np.arange(8) + len(periodic)) % 7]
    ]
    assert time.perf_counter() - t0 < 5.0
