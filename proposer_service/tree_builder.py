"""Draft trees on the proposer's side: scored candidate nodes, cut to a node budget best-first.

Every branching proposer builds its tree the same way:
    1. candidates: nodes (token, parent, score) in topological order (parent < index, -1: the
       root, i.e. the sequence's last token); a score estimates how likely the target goes down
       to that node, and a child never scores above its parent (a probability of the path, or
       its log);
    2. `select`: spend the budget best-first: the highest-scoring open node is kept next, a node
       opens once its parent is kept, and a node keeps at most max_branch children (its best
       ones). Kept nodes come out in the order they were kept, so parents precede children and
       siblings are in rank order (best first), which is the wire's contract (Draft.parents).
       Cutting the result to its first n nodes is the selection with budget n.
    3. `reindex`: the kept candidates as Draft tokens and local parents.

`ContinuationTrie` makes the candidates of the lookup proposers (n-gram, suffix): known
continuations of the matched context merged into a trie, so a shared prefix is one node; a node's
score is its path's estimated probability, the product over its ancestors of the share of weight
(occurrences) that went on to that child.
"""

from __future__ import annotations

import heapq
from typing import Sequence

__all__ = ["ContinuationTrie", "reindex", "select"]


def select(parents: Sequence[int], scores: Sequence[float], budget: int, max_branch: int,
           min_score: float = float("-inf")) -> list[int]:
    """The candidates kept, in draft order: at most `budget`, at most `max_branch` children per
    node (the root included), none scoring below `min_score`; ties go to the earlier candidate."""
    children: list[list[int]] = [[] for _ in parents]
    heap: list[tuple[float, int]] = []
    for i, p in enumerate(parents):
        if p < 0:
            heap.append((-scores[i], i))
        else:
            children[p].append(i)
    heapq.heapify(heap)
    kept: list[int] = []
    taken: dict[int, int] = {}  # candidate (or -1) -> children kept
    while heap and len(kept) < budget:
        neg, i = heapq.heappop(heap)
        p = parents[i]
        if -neg < min_score or taken.get(p, 0) >= max_branch:
            continue  # below the floor, or its parent has its best max_branch children already
        taken[p] = taken.get(p, 0) + 1
        kept.append(i)
        for c in children[i]:
            heapq.heappush(heap, (-scores[c], c))
    return kept


def reindex(tokens: Sequence[int], parents: Sequence[int],
            kept: Sequence[int]) -> tuple[list[int], list[int]]:
    """The kept candidates (draft order, parents kept before children) as (tokens, parents)
    with parents as indices into the kept list (-1: the root)."""
    at = {c: j for j, c in enumerate(kept)}
    return [tokens[c] for c in kept], [-1 if parents[c] < 0 else at[parents[c]] for c in kept]


class ContinuationTrie:
    """Continuations (token lists, each with a weight such as its number of occurrences) merged
    into one trie. Insert in rank order: among equal scores the earlier-made node wins."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.weights: list[float] = []
        self._child: dict[tuple[int, int], int] = {}  # (parent, token) -> node

    def __len__(self) -> int:
        return len(self.tokens)

    def insert(self, path: Sequence[int], weight: float = 1.0) -> None:
        node = -1
        for t in path:
            nxt = self._child.get((node, t))
            if nxt is None:
                nxt = self._child[(node, t)] = len(self.tokens)
                self.tokens.append(t)
                self.parents.append(node)
                self.weights.append(0.0)
            self.weights[nxt] += weight
            node = nxt

    def scores(self) -> list[float]:
        """Per node: the product, from the root down, of its weight over the weight of all its
        siblings (the share of the continuations that got this far and went this way)."""
        below: dict[int, float] = {}  # node (or -1) -> weight of its children
        for w, p in zip(self.weights, self.parents):
            below[p] = below.get(p, 0.0) + w
        out: list[float] = []
        for w, p in zip(self.weights, self.parents):
            out.append((1.0 if p < 0 else out[p]) * (w / below[p]))
        return out

    def tree(self, budget: int, max_branch: int,
             min_score: float = 0.0) -> tuple[list[int], list[int]]:
        """The draft (tokens, parents): the budget spent best-first over the trie's nodes."""
        kept = select(self.parents, self.scores(), budget, max_branch, min_score)
        return reindex(self.tokens, self.parents, kept)
