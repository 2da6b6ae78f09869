"""Hybrid drafts: several drafters' candidates for one sequence merged into one token tree.

A candidate is one drafter's draft for the step (a chain or a tree: tokens, parents with -1 the
root, and per node the q it was drawn from, or None where the drafter is deterministic). The
merged tree is what the tree sampler (kernels/tree_rejection.py) verifies in one forward.

    candidates [c0, c1, ...] (priority order) --merge_candidates--> tokens, parents, q rows, source
    a gated hybrid's tier (its candidates)    --tier_suffices-->   verified alone, or the next
                                                                   tier drafts too

Nodes are taken round-robin by node index (c0's node 0, c1's node 0, c0's node 1, ...), so every
candidate gets a share of the node budget; each candidate keeps a prefix of its own node list (a
topological order, so every kept node keeps its parent). A node whose (merged parent, token)
already exists is merged into that node when `_mergeable` allows, costing nothing; otherwise it
is a new node (a new sibling, possibly with the same token as an earlier one). A candidate whose
next node does not fit the budget stops there.

Why it stays lossless (the tree sampler's argument in kernels/tree_rejection.py: at every node
each child c_k must really be distributed as the q_k sent with it, given everything that decided
that it is there and everything drawn before it):
  * Greedy and seeded sequences never read q: they descend to the child equal to the target's
    (keyed) choice. Any node with the same parent and token is the same guess, merged freely.
  * An unseeded sampled sequence: two nodes merge only when both are deterministic (q None: the
    drafter's token is a function of the history and the node's ancestors). The merged node is
    then the one-hot guess either drafter would have sent, and a child hung under it by either
    drafter was drawn given exactly that prefix.
  * A sampled node is never merged, not even with an identical sibling. Merging would make the
    second drafter's node present only when its token differs from the first's: given that it
    is there, its token follows q_B conditioned on "not the first's token", not the q_B it
    carries, and the walk would accept it too often. Kept apart, the duplicate is drawn from
    q_B independently of the first drafter (different drafters draw independently), so it is an
    ordinary sibling: after the first is rejected the residual has little or no mass at that
    token and the duplicate is usually rejected, at the cost of one row.
  * Each node carries the q of the drafter that drew it (`source` says which); a deterministic
    node in a tree that has sampled nodes carries its one-hot row.
  * Which nodes fit and their sibling order depend only on how many nodes each candidate sent
    before them (sampled nodes always cost one node) and on deterministic tokens (merges), never
    on a node's own sampled token: a node's presence is decided by draws made before it or by
    another, independent drafter, so given that it is there it is still distributed as its q
    (cutting a drafter's tree to a prefix of its node list, as a pushed draft is cut to a
    step's k). The order is the candidates' fixed priority, never a comparison of their q's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

Row = tuple[list[int], list[float]]  # a sparse distribution: (token ids, probabilities)


@dataclass(frozen=True)
class Candidate:
    """One drafter's draft for a sequence's step."""

    tokens: Sequence[int]
    parents: Optional[Sequence[int]] = None  # None: a chain
    q: Optional[Sequence[Row]] = None  # per node; None: every node deterministic (one-hot)

    def parent_list(self) -> list[int]:
        return (list(range(-1, len(self.tokens) - 1)) if self.parents is None
                else [int(p) for p in self.parents])


@dataclass
class MergedTree:
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    rows: list[Optional[Row]] = field(default_factory=list)  # per node: its q, None one-hot
    source: list[int] = field(default_factory=list)  # per node: the candidate that drew it

    def q_rows(self) -> Optional[list[Row]]:
        """Every node's q row (one-hot where deterministic), or None when all are one-hot."""
        if all(r is None for r in self.rows):
            return None
        return [([t], [1.0]) if r is None else r for t, r in zip(self.tokens, self.rows)]


def _mergeable(existing: Optional[Row], new: Optional[Row], merge_sampled: bool) -> bool:
    """Whether a node may join an existing node of the same parent and token (see the module
    docstring): always where q is never read, else only two deterministic nodes."""
    return merge_sampled or (existing is None and new is None)


def _row(c: Candidate, i: int) -> Optional[Row]:
    """Node i's own q row in candidate c (None: deterministic)."""
    if c.q is None:
        return None
    idx, probs = c.q[i]
    return list(idx), list(probs)


def merge_candidates(candidates: Sequence[Candidate], max_nodes: int,
                     merge_sampled: bool) -> MergedTree:
    """One tree of at most `max_nodes` nodes from the candidates, in priority order.

    merge_sampled: True when the sequence's verification never reads q (greedy or seeded), so
    identical guesses merge whatever drew them; False for an unseeded sampled sequence (only
    deterministic nodes merge)."""
    out = MergedTree()
    index: dict[tuple[int, int], list[int]] = {}  # (merged parent, token) -> its nodes
    maps: list[list[int]] = [[] for _ in candidates]  # per candidate: local node -> merged
    parents = [c.parent_list() for c in candidates]
    open_ = [True] * len(candidates)
    longest = max((len(c.tokens) for c in candidates), default=0)
    for i in range(longest):
        for ci, c in enumerate(candidates):
            if not open_[ci] or i >= len(c.tokens):
                continue
            p = parents[ci][i]
            if not -1 <= p < i:
                raise ValueError(f"candidate {ci}: node {i}'s parent {p} is not in [-1, {i})")
            parent = -1 if p < 0 else maps[ci][p]
            token, row = int(c.tokens[i]), _row(c, i)
            same = [n for n in index.get((parent, token), ())
                    if _mergeable(out.rows[n], row, merge_sampled)]
            if same:
                maps[ci].append(same[0])
                continue
            if len(out.tokens) >= max_nodes:
                open_[ci] = False  # keeps the prefix it has: every kept node has its parent
                continue
            node = len(out.tokens)
            out.tokens.append(token)
            out.parents.append(parent)
            out.rows.append(row)
            out.source.append(ci)
            index.setdefault((parent, token), []).append(node)
            maps[ci].append(node)
    return out


# A gated hybrid's tier is verified alone when its merged draft has at least this many nodes
# (or the whole step's budget, if smaller); with fewer, the next tier drafts too.
GATE_MIN_TOKENS = 1


def tier_suffices(candidates: Sequence[Candidate], max_nodes: int,
                  min_tokens: int = GATE_MIN_TOKENS) -> bool:
    """Whether a gated hybrid's tier drafted enough for its step (`max_nodes` its budget):
    then its candidates alone are verified, and the later tiers are not asked (no model
    drafter's work, no wider tree). The tiers that gate are deterministic (splitspec/methods.py
    `hybrid_error`), so this depends on the sequence's history alone: whichever way it goes,
    the step verifies a draft like any other, and the sampler is lossless for any draft."""
    if max_nodes <= 0:
        return False
    merged = merge_candidates(candidates, max_nodes, merge_sampled=True)
    return len(merged.tokens) >= max(1, min(min_tokens, max_nodes))


__all__ = ["Candidate", "GATE_MIN_TOKENS", "MergedTree", "merge_candidates", "tier_suffices"]
