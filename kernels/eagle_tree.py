"""EAGLE-2's dynamic draft tree as pure tensor functions (no host syncs, fixed shapes).

A head drafting a tree grows it level by level from the root (the sequence's last token):

    level 1      the root's top-k children                                candidates [k]
    level d > 1  every frontier node's top-k children, scored by the path's cumulative
                 log-probability; the k best of those k * k become the next frontier and are
                 fed to the head together (one row each)                  candidates [k * k]

Every candidate made along the way is kept (tokens, parents, scores). The draft is the `budget`
best candidates by cumulative log-probability (`select`): a child never scores above its parent,
so the best `budget` always include each one's parent (ties go to the earlier candidate, which a
parent is), and listing them best first puts parents before children and siblings in rank order,
the order splitspec.proposal.Draft requires. This is the same selection as
proposer_service.tree_builder.select with no branching limit, on the device.

Candidate indices: level 1 holds 0..k-1; level d >= 2 holds k + (d - 2) * k * k + j for its j-th
candidate (frontier row j // k, that row's (j % k)-th best child).
"""

from __future__ import annotations

import torch

__all__ = ["TreeState", "first_level", "next_level", "select", "num_candidates"]


def num_candidates(top_k: int, depth: int) -> int:
    """Candidates made by a tree of `depth` levels (the size of every buffer below)."""
    return top_k + (depth - 1) * top_k * top_k


class TreeState:
    """The candidates so far and the frontier, as preallocated tensors.

    tokens, parents, scores: [N] (N = num_candidates; parents -1 at level 1, unset slots score
    -inf); frontier: [k] candidate indices; frontier_scores [k]; ancestors: [k, depth * k] bool,
    which fed rows (level d's frontier row i is fed row (d - 1) * k + i) each frontier node
    descends from, itself included once fed."""

    def __init__(self, top_k: int, depth: int, device: torch.device):
        n = num_candidates(top_k, depth)
        self.top_k, self.depth = top_k, depth
        self.tokens = torch.zeros(n, dtype=torch.long, device=device)
        self.parents = torch.full((n,), -1, dtype=torch.long, device=device)
        self.scores = torch.full((n,), float("-inf"), dtype=torch.float32, device=device)
        self.frontier = torch.arange(top_k, device=device)
        self.frontier_scores = torch.zeros(top_k, dtype=torch.float32, device=device)
        self.ancestors = torch.zeros(top_k, depth * top_k, dtype=torch.bool, device=device)


def first_level(state: TreeState, logp: torch.Tensor) -> torch.Tensor:
    """Level 1 from the root's log-probabilities logp [V]: its top-k children become candidates
    0..k-1 and the frontier. Returns their tokens [k] (the rows to feed next)."""
    k = state.top_k
    vals, toks = logp.float().topk(k)  # [k]
    state.tokens[:k] = toks
    state.scores[:k] = vals
    state.frontier = torch.arange(k, device=logp.device)
    state.frontier_scores = vals
    state.ancestors[:, :k] = torch.eye(k, dtype=torch.bool, device=logp.device)
    return toks


def next_level(state: TreeState, level: int, logp: torch.Tensor) -> tuple[torch.Tensor,
                                                                          torch.Tensor]:
    """Level `level` (>= 2) from the frontier's log-probabilities logp [k, V] (row i: after
    frontier node i). Records all k * k children as candidates, makes the best k the new
    frontier. Returns (tokens [k] to feed next, rows [k]: which frontier row each descends
    from, for the caller's hidden states)."""
    k = state.top_k
    vals, toks = logp.float().topk(k, dim=-1)  # [k, k]
    cum = (state.frontier_scores[:, None] + vals).reshape(-1)  # [k * k]
    base = k + (level - 2) * k * k
    n = k * k
    state.tokens[base:base + n] = toks.reshape(-1)
    state.parents[base:base + n] = state.frontier.repeat_interleave(k)
    state.scores[base:base + n] = cum
    best = cum.topk(k).indices  # [k] into the k * k, best first
    rows = best // k
    state.frontier = base + best
    state.frontier_scores = cum[best]
    anc = state.ancestors[rows].clone()
    fed = (level - 1) * k + torch.arange(k, device=logp.device)
    anc.scatter_(1, fed[:, None], True)  # a scalar fill on the device: no host value copied in
    state.ancestors = anc
    return toks.reshape(-1)[best], rows


def select(scores: torch.Tensor, parents: torch.Tensor, budget: int) -> tuple[torch.Tensor,
                                                                          torch.Tensor]:
    """The `budget` best candidates by score, best first (ties: earlier candidate first), and
    each one's parent as an index into that list (-1: the root). scores, parents [N];
    returns (kept [budget] candidate indices, local_parents [budget])."""
    n = scores.shape[0]
    budget = min(budget, n)
    # a stable descending sort keeps earlier candidates first among equal scores
    order = torch.sort(scores, descending=True, stable=True).indices[:budget]
    local = torch.full((n,), -1, dtype=torch.long, device=scores.device)
    local[order] = torch.arange(budget, device=scores.device)
    par = parents[order]
    local_parents = torch.where(par < 0, par, local[par.clamp(min=0)])
    return order, local_parents
