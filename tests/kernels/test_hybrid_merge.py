"""Hybrid drafts' merge (kernels/hybrid_merge.py): common prefixes merged once, the node limit
kept, each node's q its own drafter's; and, through the tree sampler, the merged tree of a
deterministic and two sampled drafters emits tokens distributed as the target (chi-square),
with planted controls for each."""

from __future__ import annotations

import random

import pytest
import torch

import kernels.hybrid_merge as hm
from kernels.hybrid_merge import Candidate, tier_suffices
from kernels.tree_rejection import tree_rejection_sample

QA = ([1, 2], [0.75, 0.25])
QB = ([3, 1], [0.5, 0.5])


def test_common_prefixes_are_merged_once_and_the_rest_branch():
    a = Candidate([5, 6, 7, 8])
    b = Candidate([5, 6, 9])
    m = hm.merge_candidates([a, b], max_nodes=8, merge_sampled=True)
    assert m.tokens == [5, 6, 7, 9, 8]
    assert m.parents == [-1, 0, 1, 1, 2]
    assert m.source == [0, 0, 0, 1, 0]
    assert m.q_rows() is None  # all deterministic: the draft carries no q


def test_trees_merge_into_chains_at_any_depth():
    tree = Candidate([5, 4, 6, 3], parents=[-1, -1, 0, 1])  # 5 -> 6 and 4 -> 3
    chain = Candidate([4, 3, 2])
    m = hm.merge_candidates([tree, chain], max_nodes=8, merge_sampled=False)
    # round-robin by node index: the chain's 4 -> 3 comes before the tree's own 4 -> 3 joins it
    assert m.tokens == [5, 4, 3, 6, 2]
    assert m.parents == [-1, -1, 1, 0, 2]
    assert m.source == [0, 1, 1, 0, 1]


@pytest.mark.parametrize("limit,tokens", [(3, [5, 6, 7]), (4, [5, 6, 7, 9]), (5, [5, 6, 7, 9, 8])])
def test_the_node_limit_is_kept_with_every_kept_node_under_its_parent(limit, tokens):
    m = hm.merge_candidates([Candidate([5, 6, 7, 8]), Candidate([5, 6, 9, 1])], limit, True)
    assert m.tokens == tokens
    assert all(-1 <= p < i for i, p in enumerate(m.parents))


def test_random_candidates_keep_the_limit_and_each_nodes_own_q():
    rng = random.Random(3)
    for _ in range(200):
        cands = []
        for c in range(rng.randint(1, 3)):
            n = rng.randint(0, 6)
            parents = [rng.randint(-1, i - 1) for i in range(n)]
            tokens = [rng.randrange(4) for _ in range(n)]
            q = None
            if rng.random() < 0.5:
                q = [([t, 9], [0.5 + 0.01 * c, 0.5 - 0.01 * c]) for t in tokens]
            cands.append(Candidate(tokens, parents, q))
        limit = rng.randint(1, 8)
        m = hm.merge_candidates(cands, limit, merge_sampled=False)
        assert len(m.tokens) <= limit
        assert all(-1 <= p < i for i, p in enumerate(m.parents))
        for node, (src, row) in enumerate(zip(m.source, m.rows)):
            c = cands[src]
            if c.q is None:
                assert row is None
            else:  # the very row of the node it came from: same drafter, same token
                assert row is not None and row[0][0] == m.tokens[node]
                assert abs(row[1][0] - (0.5 + 0.01 * src)) < 1e-9


def test_sampled_nodes_stay_apart_and_deterministic_ones_merge():
    det = Candidate([1, 2])
    det2 = Candidate([1, 3])
    sampled = Candidate([1, 2], q=[QA, QA])
    m = hm.merge_candidates([det, sampled, det2], max_nodes=8, merge_sampled=False)
    # det's 1 and det2's 1 are one node; sampled's 1 is its own sibling (with its own q)
    assert m.tokens == [1, 1, 2, 2, 3]
    assert m.parents == [-1, -1, 0, 1, 0]
    assert m.source == [0, 1, 0, 1, 2]
    assert m.q_rows() == [([1], [1.0]), QA, ([2], [1.0]), QA, ([3], [1.0])]
    # greedy or seeded: the same guesses, merged whatever drew them
    g = hm.merge_candidates([det, sampled, det2], max_nodes=8, merge_sampled=True)
    assert g.tokens == [1, 2, 3] and g.parents == [-1, 0, 0]


# -- lossless through the tree sampler -----------------------------------------------------------

V, N = 4, 6000
P_ROOT = torch.tensor([0.02, 0.08, 0.3, 0.6])
Q_A = torch.tensor([0.85, 0.05, 0.05, 0.05])
Q_B = torch.tensor([0.1, 0.1, 0.1, 0.7])


def _pvalue(observed: torch.Tensor, expected: torch.Tensor) -> float:
    obs, exp = observed.double(), expected.double()
    stat = ((obs - exp) ** 2 / exp).sum()
    return float(torch.special.gammaincc(torch.tensor((V - 1) / 2.0, dtype=torch.float64),
                                         stat / 2))


def first_token_pvalue(seed: int = 7) -> float:
    """N sequences, each a merged tree of a deterministic candidate (token 0, then 1) and two
    sampled one-node candidates drawn from Q_A and Q_B: the first emitted token against P_ROOT."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.multinomial(Q_A, N, replacement=True, generator=gen).tolist()
    b = torch.multinomial(Q_B, N, replacement=True, generator=gen).tolist()
    full = lambda q: (list(range(V)), q.tolist())  # noqa: E731
    tokens, parents, rows, rows_p = [], [], [], []
    for ta, tb in zip(a, b):
        m = hm.merge_candidates([Candidate([0, 1]), Candidate([ta], q=[full(Q_A)]),
                                 Candidate([tb], q=[full(Q_B)])], max_nodes=4,
                                merge_sampled=False)
        tokens.append(m.tokens)
        parents.append(m.parents)
        rows.append(m.q_rows() or [([t], [1.0]) for t in m.tokens])
        rows_p.append(torch.cat([P_ROOT[None], torch.full((len(m.tokens), V), 1.0 / V)]))
    flat = [t for ts in tokens for t in ts]
    q = torch.zeros(len(flat), V)  # dense [D, V]: each node's row as the merge gave it
    at = [(d, i, pr) for d, (idx, probs) in enumerate(r for rs in rows for r in rs)
          for i, pr in zip(idx, probs)]
    q[[d for d, _, _ in at], [i for _, i, _ in at]] = torch.tensor([pr for *_, pr in at])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        res = tree_rejection_sample(torch.cat(rows_p), torch.tensor(flat), parents,
                                    torch.tensor([len(t) for t in tokens]), q,
                                    torch.zeros(N, dtype=torch.bool))
    first = res.output_token_ids[:, 0]
    return _pvalue(torch.bincount(first, minlength=V), P_ROOT * N)


def test_merged_sampled_and_deterministic_drafts_are_distributed_as_the_target():
    assert first_token_pvalue() > 1e-3


@pytest.mark.parametrize("plant", ["hybrid_node_takes_another_candidates_q",
                                   "hybrid_sampled_duplicates_merged"])
def test_the_check_catches_a_wrong_q_or_a_merged_sampled_node(monkeypatch, plant):
    import planted_bugs as bug

    getattr(bug, plant)(monkeypatch)
    assert first_token_pvalue() < 1e-3


def test_the_structure_checks_catch_a_prefix_kept_twice(monkeypatch):
    import planted_bugs as bug

    bug.hybrid_shared_prefix_kept_twice(monkeypatch)
    with pytest.raises(AssertionError):
        test_common_prefixes_are_merged_once_and_the_rest_branch()


def test_the_limit_check_catches_a_budget_ignored(monkeypatch):
    import planted_bugs as bug

    bug.hybrid_node_limit_ignored(monkeypatch)
    with pytest.raises(AssertionError):
        test_random_candidates_keep_the_limit_and_each_nodes_own_q()


def test_the_q_check_catches_another_candidates_q(monkeypatch):
    import planted_bugs as bug

    bug.hybrid_node_takes_another_candidates_q(monkeypatch)
    with pytest.raises(AssertionError):
        test_random_candidates_keep_the_limit_and_each_nodes_own_q()


# -- gated hybrids: whether a tier's draft is verified alone -----------------------------------

def test_a_tier_suffices_when_it_drafted_at_least_the_gate_s_tokens():
    one, three = Candidate([7]), Candidate([1, 2, 3])
    assert not tier_suffices([], 4)  # nothing drafted: the next tier drafts
    assert tier_suffices([one], 4) and tier_suffices([three], 4)  # the default gate: 1 token
    assert not tier_suffices([one], 4, min_tokens=2) and tier_suffices([three], 4, min_tokens=2)
    # two retrieval chains merged: their shared prefix counts once
    assert not tier_suffices([Candidate([1, 2]), Candidate([1, 2])], 4, min_tokens=3)
    assert tier_suffices([Candidate([1, 2]), Candidate([1, 5])], 4, min_tokens=3)
    # a gate above the step's budget asks for the whole budget; no budget: never verified alone
    assert tier_suffices([three], 2, min_tokens=5) and not tier_suffices([three], 0)
