"""The draft model's tree: its chain with the draft's likeliest other tokens as leaves beside each
chain node (up to max_branch - 1 of them), the node budget spent by cumulative draft probability
(tree_builder.select).

The drafting loop already records, per drafted position, the draft model's likeliest tokens and
their probabilities (draft_loop.Alternatives). Where the draft's mass splits, the others are good
second guesses at that position: they cost no extra draft forward, only a node each.
Scores (an estimate of reaching and accepting the node):
    chain node i     reach_i * P(d_i),     reach_i = prod_{j < i} P(d_j)
    leaves beside i  reach_i * P(a),       each capped at the sibling before it (the chain node
                                           first), so siblings keep the draft's rank order
so a confident chain runs deep and an unsure position branches. This is EAGLE-2's expansion by
cumulative draft probability one level deep: a leaf is not expanded further (its own children
would need a second draft pass, or tree attention in the draft's cache).

The leaf always comes after its chain sibling (the cap; ties go to the earlier candidate): for a
sampled request the chain token was drawn from q and the leaf, chosen given it, is deterministic
(sent with a one-hot q), which the tree sampler verifies losslessly only in that order. A
greedy request's nodes are all deterministic (no q).
"""

from __future__ import annotations

from kernels.sparse_probs import SparseProbs
from proposer_service.draft_loop import Alternatives
from proposer_service.tree_builder import reindex, select
from splitspec.proposal import Draft


def branch_chain(chain: Draft, alternatives: list[Alternatives], budget: int,
                 max_branch: int) -> Draft:
    """The chain (its tokens, q when sampled) as a tree of at most budget nodes, each chain node
    with the draft's likeliest other tokens there as leaf siblings (up to max_branch - 1)."""
    q_rows = None if chain.q is None else chain.q.rows()
    tokens: list[int] = []
    parents: list[int] = []
    scores: list[float] = []
    rows: list[tuple[list[int], list[float]]] = []
    reach, above = 1.0, -1  # above: the chain node the next ones hang from
    for i, (token, (ids, probs)) in enumerate(zip(chain.tokens, alternatives)):
        others = [(a, p) for a, p in zip(ids, probs) if a != token][:max_branch - 1]
        p_token = probs[ids.index(token)] if token in ids else _q_prob(q_rows, i, token)
        node = len(tokens)
        tokens.append(token)
        parents.append(above)
        scores.append(reach * p_token)
        rows.append(q_rows[i] if q_rows is not None else ([token], [1.0]))
        for other, p_other in others:
            tokens.append(other)
            parents.append(above)
            scores.append(min(reach * p_other, scores[-1]))
            rows.append(([other], [1.0]))
        reach *= p_token
        above = node
    kept = select(parents, scores, budget, max_branch)
    out_tokens, out_parents = reindex(tokens, parents, kept)
    q = None if q_rows is None or not kept else SparseProbs.from_rows([rows[c] for c in kept])
    return Draft(chain.seq_id, out_tokens, q, ahead_outcome=chain.ahead_outcome,
                 parents=out_parents)


def _q_prob(q_rows, i: int, token: int) -> float:
    """The probability of a sampled token in the q it was drawn from (0 without one)."""
    if q_rows is None:
        return 0.0
    ids, probs = q_rows[i]
    return probs[ids.index(token)] if token in ids else 0.0
