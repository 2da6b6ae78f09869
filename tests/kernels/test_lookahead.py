"""Lookahead decoding's window as a draft tree (kernels/lookahead.py): the step layout built from
its parents gives exactly the paper's 2-D mask and positions (dense reference written from the
paper's rule, not from parents), the window update is a reference Jacobi iteration that keeps every
guess at the position it was made for, harvested n-grams end in the target's own continuation, and
the candidate trie merges shared prefixes within its budget."""

from __future__ import annotations

import random

import planted_bugs as bug
import pytest
import torch

import kernels.lookahead as lookahead
from kernels.layout import StepLayout
from kernels.lookahead import (
    advance_window,
    comb_depths,
    comb_parents,
    harvest_ngrams,
    trie_from_continuations,
)


def _paper_mask(width: int, levels: int) -> tuple[list[int], torch.Tensor]:
    """Position offsets and visibility of the root + window, straight from the paper's rule:
    (l, j) at offset l + j + 1 sees the root, level 0 columns 0..j and levels 1..l of column j."""
    nodes = [(lv, j) for lv in range(levels) for j in range(width)]
    offsets = [0] + [lv + j + 1 for lv, j in nodes]
    n = len(nodes) + 1
    see = torch.zeros(n, n, dtype=torch.bool)
    see[:, 0] = True
    for a, (lv, j) in enumerate(nodes, start=1):
        for b, (lv2, j2) in enumerate(nodes, start=1):
            see[a, b] = (lv2 == 0 and j2 <= j) or (j2 == j and 1 <= lv2 <= lv)
    return offsets, see


@pytest.mark.parametrize("width,levels", [(1, 1), (4, 1), (3, 2), (5, 4), (15, 4)])
def test_the_window_as_a_tree_gives_the_papers_mask_and_positions(width, levels):
    start = 11
    parents = comb_parents(width, levels)
    k = len(parents)
    layout = StepLayout.build([k + 1], [start], [k], [True], [parents])
    offsets, see = _paper_mask(width, levels)
    assert layout.positions().tolist() == [start + o for o in offsets]
    assert comb_depths(width, levels) == offsets[1:]
    relation = layout.ancestors[0] if layout.ancestors is not None else torch.tril(
        torch.ones(k + 1, k + 1, dtype=torch.bool))
    assert torch.equal(relation, see)


def test_the_window_appends_after_candidate_nodes():
    cand_tokens, cand_parents = trie_from_continuations([[5, 6], [5, 7]], budget=8)
    window = comb_parents(2, 2, first_index=len(cand_tokens))
    parents = cand_parents + window
    assert all(p < i for i, p in enumerate(parents))
    layout = StepLayout.build([len(parents) + 1], [0], [len(parents)], [True], [parents])
    rows = layout.ancestors[0]
    w0 = 1 + len(cand_tokens)  # the first window row (row 0 is the root)
    for r in range(w0, len(parents) + 1):  # window rows never see a candidate node
        assert not rows[r, 1:w0].any()


def _target(context: tuple[int, ...]) -> int:
    """A deterministic 'greedy target' over a 50-token vocabulary."""
    return (7 * context[-1] + 3 * (context[-2] if len(context) > 1 else 0) + len(context)) % 50


def _jacobi_outputs(prefix, levels):
    """Reference Jacobi step: the target's argmax at each top-level node given what it sees."""
    top = len(levels) - 1
    outs = []
    for j in range(len(levels[0])):
        seen = list(prefix) + list(levels[0][: j + 1]) + [levels[lv][j] for lv in range(1, top + 1)]
        outs.append(_target(tuple(seen)))
    return outs


@pytest.mark.parametrize("n", [2, 3, 5])
def test_advancing_keeps_every_guess_at_the_position_it_was_made_for(n):
    check_guesses_keep_their_positions(n)


def test_the_position_check_catches_a_window_that_does_not_move(monkeypatch):
    check_guesses_keep_their_positions(3)
    bug.lookahead_window_not_shifted(monkeypatch)
    with pytest.raises(AssertionError):
        check_guesses_keep_their_positions(3)


def check_guesses_keep_their_positions(n):
    rng = random.Random(n)
    width = 6
    fresh = iter(range(1000, 10**6))  # every guess a distinct token, so it can be traced
    seq = [rng.randrange(50) for _ in range(5)]  # the decoded sequence; root = seq[-1]
    made_for = {}  # guess token -> the absolute position it guesses
    levels = [[next(fresh) for _ in range(width)]]
    for j, t in enumerate(levels[0]):
        made_for[t] = len(seq) + j  # level 0, column j: root + j + 1
    for _ in range(30):
        top = len(levels) - 1
        outs = [next(fresh) for _ in range(width)]  # the Jacobi outputs of the top level
        for j, t in enumerate(outs):  # node (top, j) at root + top + j + 1 predicts the next one
            made_for[t] = len(seq) - 1 + top + j + 2
        emitted = rng.choice([1, 1, 2, 3])
        seq += [rng.randrange(50) for _ in range(emitted)]
        fill = [-1 - i for i in range(width)]  # refills: no position claimed
        fills_before = sum(t < 0 for level in levels for t in level)
        full = len(levels) == n - 1
        levels = lookahead.advance_window(levels, outs, n, emitted, fill)
        assert len(levels) == min(top + 2, n - 1)
        root = len(seq) - 1
        for lv, level in enumerate(levels):
            assert len(level) == width
            for j, t in enumerate(level):
                if t >= 0:
                    assert made_for[t] == root + lv + j + 1, (lv, j)
        if full and emitted == 1:  # a full window that moved one position refills nothing
            assert sum(t < 0 for level in levels for t in level) <= fills_before


def test_harvested_ngrams_end_in_the_targets_continuation():
    rng = random.Random(1)
    n, width = 4, 5
    prefix = [rng.randrange(50) for _ in range(6)]
    levels = [[rng.randrange(50) for _ in range(width)] for _ in range(n - 1)]
    outs = _jacobi_outputs(prefix, levels)
    grams = harvest_ngrams(levels, outs, n)
    assert len(grams) == width and all(len(g) == n for g in grams)
    for j, g in enumerate(grams):
        assert g[:-1] == tuple(levels[lv][j] for lv in range(n - 1))
        seen = list(prefix) + list(levels[0][: j + 1]) + [levels[lv][j] for lv in range(1, n - 1)]
        assert g[-1] == _target(tuple(seen))
    assert harvest_ngrams(levels[:-1], outs, n) == []  # still filling: nothing harvested


def test_advance_rejects_impossible_steps():
    with pytest.raises(ValueError):
        advance_window([[1, 2]], [3, 4], 3, 0, [0, 0])
    with pytest.raises(ValueError):
        advance_window([[1, 2]], [3, 4], 3, 1, [0])


def test_trie_merges_prefixes_and_cuts_at_the_budget():
    tokens, parents = trie_from_continuations([[1, 2, 3], [1, 2, 4], [5, 6]], budget=10)
    assert tokens == [1, 2, 3, 4, 5, 6]
    assert parents == [-1, 0, 1, 1, -1, 4]
    tokens, parents = trie_from_continuations([[1, 2, 3], [1, 2, 4], [5, 6]], budget=4)
    assert tokens == [1, 2, 3, 4] and parents == [-1, 0, 1, 1]
    assert trie_from_continuations([], budget=4) == ([], [])
    assert trie_from_continuations([[1, 2]], budget=0) == ([], [])
