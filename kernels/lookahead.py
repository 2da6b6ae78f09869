"""Lookahead decoding's Jacobi window as a draft tree (Fu et al., 2024), pure functions.

The window holds L = N - 1 levels of W guessed tokens, levels[0] the oldest. With p the position
of the sequence's last token (the step's root), token (l, j) sits at position p + l + j + 1 and
sees the cached prefix, the root, level 0's columns 0..j and the levels 1..l of its own column:

    level 2        . . c2 ...        (2, j): p + 3 + j
    level 1      . . b2 ...          (1, j): p + 2 + j
    level 0    a0 a1 a2 ...          (0, j): p + 1 + j
    root      r                      p

That visibility is a tree: (0, 0) hangs off the root, (0, j) off (0, j - 1) and (l, j) off
(l - 1, j), so every node's ancestors are exactly what the paper's 2-D mask lets it see and its
depth is its position offset (kernels/layout.py places a node at the position of its depth). The
window therefore travels in the step as part of the sequence's draft tree, beside the candidate
n-grams: the target's argmax at node (L - 1, j) is the next Jacobi guess for position
p + L + j + 1, and every node is a deterministic candidate the tree sampler may accept (a window
that happens to be right is taken for free; one that is wrong costs nothing but its row).

After a step that emitted e tokens the root moves to p + e. The window keeps every guess at the
position it was made for: with a full window, level 0 is dropped, the new outputs become the top
level, and each level moves e - 1 columns left; while the window is still filling, no level is
dropped and the shift is e. Columns shifted out of the front are lost; the back is refilled.

An n-gram is harvested per column of a full window: (levels[0][j], ..., levels[L-1][j], out[j]),
N tokens at consecutive positions whose last one is the target's own greedy continuation of the
others (given the context they were guessed in).
"""

from __future__ import annotations

from typing import Sequence

__all__ = [
    "advance_window",
    "comb_depths",
    "comb_parents",
    "harvest_ngrams",
    "trie_from_continuations",
]


def comb_parents(width: int, num_levels: int, first_index: int = 0) -> list[int]:
    """Parents of the window's nodes, level-major ((0, 0), (0, 1), ..., (1, 0), ...), appended to
    a draft tree that already has `first_index` nodes; -1 is the root."""
    parents = []
    for level in range(num_levels):
        for j in range(width):
            if level == 0:
                parents.append(-1 if j == 0 else first_index + j - 1)
            else:
                parents.append(first_index + (level - 1) * width + j)
    return parents


def comb_depths(width: int, num_levels: int) -> list[int]:
    """Depth of each window node (level-major): (l, j) -> l + j + 1."""
    return [level + j + 1 for level in range(num_levels) for j in range(width)]


def harvest_ngrams(levels: Sequence[Sequence[int]], outputs: Sequence[int], n: int
                   ) -> list[tuple[int, ...]]:
    """The N-grams of a full window (len(levels) == n - 1) and its top level's outputs, one per
    column; none while the window is still filling."""
    if n < 2 or len(levels) != n - 1:
        return []
    width = len(outputs)
    return [tuple(level[j] for level in levels) + (outputs[j],) for j in range(width)]


def advance_window(levels: Sequence[Sequence[int]], outputs: Sequence[int], n: int,
                   emitted: int, fill: Sequence[int]) -> list[list[int]]:
    """The window for the next step: `outputs` (the target's argmax at the top level's nodes,
    one per column) become the new top level, level 0 is dropped once the window holds n - 1
    levels, and every level moves so that each guess keeps the position it was made for after
    the root advanced by `emitted` tokens. Vacated back columns take tokens from `fill` (at least
    width of them; the caller's guesses, e.g. tokens of the prompt)."""
    if emitted < 1:
        raise ValueError(f"a step emits at least one token, got {emitted}")
    width = len(outputs)
    if len(fill) < width:
        raise ValueError(f"fill needs at least {width} tokens, got {len(fill)}")
    full = len(levels) >= n - 1
    kept = [list(level) for level in (levels[1:] if full else levels)] + [list(outputs)]
    shift = emitted - 1 if full else emitted
    if shift <= 0:
        return kept
    shift = min(shift, width)
    return [level[shift:] + list(fill[: shift]) for level in kept]


def trie_from_continuations(continuations: Sequence[Sequence[int]], budget: int
                            ) -> tuple[list[int], list[int]]:
    """(tokens, parents) of the trie of `continuations` (each the tokens after the root, in rank
    order), shared prefixes merged, nodes in insertion order (parents first), at most `budget`
    nodes: a continuation that does not fit whole is cut where the budget ends."""
    tokens: list[int] = []
    parents: list[int] = []
    children: dict[tuple[int, int], int] = {}  # (parent index, token) -> node index
    for cont in continuations:
        parent = -1
        for tok in cont:
            node = children.get((parent, int(tok)))
            if node is None:
                if len(tokens) >= budget:
                    break
                node = len(tokens)
                tokens.append(int(tok))
                parents.append(parent)
                children[(parent, int(tok))] = node
            parent = node
    return tokens, parents
