"""The shared draft-tree builder: best-first selection within a node budget (parents before
children, at most max_branch children, siblings in rank order, the cut of a tree is the tree of
the smaller budget), the continuation trie's merged prefixes and shares, and a tree drafted
ahead being served cut to a step's node count."""

from __future__ import annotations

import random

import pytest

from proposer_service.tree_builder import ContinuationTrie, reindex, select
from splitspec.proposal import AheadDraft, Draft, SequenceStep


def random_candidates(rng: random.Random, n: int) -> tuple[list[int], list[float]]:
    """A random candidate tree whose scores never rise from parent to child (ties included)."""
    parents, scores = [], []
    for i in range(n):
        p = rng.randrange(-1, i)
        top = 1.0 if p < 0 else scores[p]
        scores.append(top if rng.random() < 0.15 else top * rng.choice([0.25, 0.5, 0.75, 1.0]))
        parents.append(p)
    return parents, scores


def check_tree(parents: list[int], max_branch: int) -> None:
    children: dict[int, int] = {}
    for i, p in enumerate(parents):
        assert -1 <= p < i  # topological: a parent precedes its children
        children[p] = children.get(p, 0) + 1
    assert max(children.values(), default=0) <= max_branch


@pytest.mark.parametrize("seed", range(4))
def test_selection_is_best_first_within_budget_and_branching(seed):
    rng = random.Random(seed)
    for _ in range(100):
        n = rng.randrange(0, 30)
        parents, scores = random_candidates(rng, n)
        budget, branch = rng.randrange(0, 12), rng.randrange(1, 4)
        kept = select(parents, scores, budget, branch)
        assert len(kept) == len(set(kept)) <= budget
        tokens, local = reindex(list(range(100, 100 + n)), parents, kept)
        assert tokens == [100 + c for c in kept]
        check_tree(local, branch)
        # each node keeps a prefix of its children ranked by score (ties: earlier first), in
        # that order
        for node in [-1, *kept]:
            ranked = sorted((c for c in range(n) if parents[c] == node),
                            key=lambda c: (-scores[c], c))
            mine = [c for c in kept if parents[c] == node]
            assert mine == ranked[:len(mine)]
            # a node short of children, short of nothing else, lost nothing to the budget
            if len(mine) < min(branch, len(ranked)) and len(kept) < budget:
                pytest.fail(f"node {node} could have kept {ranked[len(mine)]}")
        # the first m nodes are the selection with budget m
        for m in range(len(kept) + 1):
            assert select(parents, scores, m, branch) == kept[:m]


def test_without_a_branching_limit_the_budget_takes_the_best_scores():
    rng = random.Random(7)
    for _ in range(100):
        parents, scores = random_candidates(rng, rng.randrange(0, 25))
        budget = rng.randrange(0, 10)
        kept = select(parents, scores, budget, max_branch=len(parents) + 1)
        best = sorted(range(len(parents)), key=lambda c: (-scores[c], c))[:budget]
        assert sorted(scores[c] for c in kept) == sorted(scores[c] for c in best)


def test_min_score_drops_nodes_and_their_subtrees():
    parents, scores = [-1, 0, -1, 2], [0.9, 0.4, 0.3, 0.3]
    assert select(parents, scores, 10, 2, min_score=0.35) == [0, 1]
    assert select(parents, scores, 10, 2) == [0, 1, 2, 3]
    assert select(parents, scores, 10, 1) == [0, 1]  # the root keeps its best child only


def test_trie_merges_shared_prefixes_and_scores_by_share():
    trie = ContinuationTrie()
    trie.insert([1, 2, 3], 3)
    trie.insert([1, 2, 4], 1)
    trie.insert([5, 6], 2)
    assert len(trie) == 6  # [1, 2] is shared
    assert trie.tokens == [1, 2, 3, 4, 5, 6] and trie.parents == [-1, 0, 1, 1, -1, 4]
    assert trie.scores() == pytest.approx([4 / 6, 4 / 6, 3 / 6, 1 / 6, 2 / 6, 2 / 6])
    # best-first: the frequent branch goes deepest before the others get a node
    assert trie.tree(4, 2) == ([1, 2, 3, 5], [-1, 0, 1, -1])
    assert trie.tree(6, 2) == ([1, 2, 3, 5, 6, 4], [-1, 0, 1, -1, 3, 1])
    assert trie.tree(6, 1) == ([1, 2, 3], [-1, 0, 1])  # a chain: the best path
    assert trie.tree(6, 2, min_score=0.4) == ([1, 2, 3], [-1, 0, 1])


def test_a_tree_drafted_ahead_is_served_cut_to_the_steps_node_count():
    tree = Draft("s", [10, 11, 12, 13, 14], parents=[-1, 0, -1, 1, 2])
    ahead = AheadDraft(7, (5,), tree)
    step = SequenceStep("s", [5], 7, 4, max_branch=2)
    assert ahead.serves(step)
    cut = ahead.taken(4)
    assert cut.tokens == [10, 11, 12, 13] and cut.parents == [-1, 0, -1, 1]
    # a chain step is not served a cut that branches, but is when the cut is still a chain
    assert not ahead.serves(SequenceStep("s", [5], 7, 3))
    assert ahead.serves(SequenceStep("s", [5], 7, 2))
    assert ahead.taken(2).parents == [-1, 0]
    assert Draft("c", [1, 2, 3]).parents == [-1, 0, 1]  # no parents: the chain
