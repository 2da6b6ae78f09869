"""The draft model's tree: its chain with the draft's likeliest other tokens as leaves beside each
chain node (up to max_branch - 1 of them), the node budget spent by cumulative draft probability
(tree_builder.select).

The drafting loop already records, per drafted position, the draft model's likeliest tokens and
their probabilities (loop.Alternatives). Where the draft's mass splits, the others are good
second guesses at that position: they cost no extra draft forward, only a node each.
Scores (an estimate of reaching and accepting the node):
    chain node i     reach_i * P(d_i),     reach_i = prod_{j < i} P(d_j)
    leaves beside i  reach_i * P(a),       each capped at the sibling before it (the chain node
                                           first), so siblings keep the draft's rank order
so a confident chain runs deep and an unsure position branches (EAGLE-2's expansion by
cumulative draft probability). The leaves a tree keeps are then grown: the draft session drafts
a chain after each of them in one more batched pass over the shared cache
(DraftModelProposer.draft_shared), and the tree is selected again with those chains under their
leaves, each node scored by its path's draft probability (never above its parent):
    under a leaf   score(leaf) * prod P(s_1..s_j)

The leaf always comes after its chain sibling (the cap; ties go to the earlier candidate): for a
sampled request the chain token was drawn from q and the leaf, chosen given it, is deterministic
(sent with a one-hot q), which the tree sampler verifies losslessly only in that order. The
chain under a leaf was drawn from the draft's q after the leaf and is sent with it. A greedy
request's nodes are all deterministic (no q).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from kernels.sparse_probs import SparseProbs
from proposer_service.draft.loop import Alternatives
from proposer_service.tree_builder import reindex, select
from splitspec.proposal import Draft

# A leaf grown into a chain of its own: (chain position of the leaf, leaf token) -> the draft
# continuing it and the draft's alternatives along it (DraftSession grows the kept leaves with
# one more batched draft pass over the shared cache).
Subtrees = Mapping[tuple[int, int], tuple[Draft, list[Alternatives]]]


@dataclass
class _Candidates:
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    rows: list[tuple[list[int], list[float]]] = field(default_factory=list)
    leaves: dict[int, tuple[int, int]] = field(default_factory=dict)  # candidate -> (pos, token)

    def add(self, token: int, parent: int, score: float, row) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.scores.append(score)
        self.rows.append(row)
        return len(self.tokens) - 1


def _candidates(chain: Draft, alternatives: list[Alternatives], max_branch: int,
                subtrees: Subtrees) -> _Candidates:
    q_rows = None if chain.q is None else chain.q.rows()
    c = _Candidates()
    reach, above = 1.0, -1  # above: the chain node the next ones hang from
    for i, (token, (ids, probs)) in enumerate(zip(chain.tokens, alternatives)):
        others = [(a, p) for a, p in zip(ids, probs) if a != token][:max_branch - 1]
        p_token = probs[ids.index(token)] if token in ids else _q_prob(q_rows, i, token)
        node = c.add(token, above, reach * p_token,
                     q_rows[i] if q_rows is not None else ([token], [1.0]))
        sibling = c.scores[node]
        for other, p_other in others:
            sibling = min(reach * p_other, sibling)  # capped: siblings stay in rank order
            leaf = c.add(other, above, sibling, ([other], [1.0]))
            c.leaves[leaf] = (i, other)
            if (i, other) in subtrees:
                _grow(c, leaf, *subtrees[(i, other)])
        reach *= p_token
        above = node
    return c


def _grow(c: _Candidates, leaf: int, sub: Draft, alternatives: list[Alternatives]) -> None:
    """The chain drafted after a leaf, under it: each node scored by the path's draft
    probability (never above its parent), with the q it was drawn from when sampled."""
    q_rows = None if sub.q is None else sub.q.rows()
    parent = leaf
    for j, (token, (ids, probs)) in enumerate(zip(sub.tokens, alternatives)):
        p_token = probs[ids.index(token)] if token in ids else _q_prob(q_rows, j, token)
        parent = c.add(token, parent, c.scores[parent] * p_token,
                       q_rows[j] if q_rows is not None else ([token], [1.0]))


def kept_leaves(chain: Draft, alternatives: list[Alternatives], budget: int,
                max_branch: int) -> list[tuple[int, int]]:
    """The (chain position, token) of the leaves the tree of `budget` nodes keeps: the ones
    worth growing."""
    c = _candidates(chain, alternatives, max_branch, {})
    return [c.leaves[k] for k in select(c.parents, c.scores, budget, max_branch)
            if k in c.leaves]


def branch_chain(chain: Draft, alternatives: list[Alternatives], budget: int,
                 max_branch: int, subtrees: Subtrees | None = None) -> Draft:
    """The chain (its tokens, q when sampled) as a tree of at most budget nodes, each chain node
    with the draft's likeliest other tokens there as leaf siblings (up to max_branch - 1), and
    under a leaf the chain drafted after it where `subtrees` has one."""
    c = _candidates(chain, alternatives, max_branch, subtrees or {})
    kept = select(c.parents, c.scores, budget, max_branch)
    out_tokens, out_parents = reindex(c.tokens, c.parents, kept)
    sampled = chain.q is not None or any(d.q is not None for d, _ in (subtrees or {}).values())
    q = SparseProbs.from_rows([c.rows[k] for k in kept]) if sampled and kept else None
    return Draft(chain.seq_id, out_tokens, q, ahead_outcome=chain.ahead_outcome,
                 parents=out_parents)


def _q_prob(q_rows, i: int, token: int) -> float:
    """The probability of a sampled token in the q it was drawn from (0 without one)."""
    if q_rows is None:
        return 0.0
    ids, probs = q_rows[i]
    return probs[ids.index(token)] if token in ids else 0.0
