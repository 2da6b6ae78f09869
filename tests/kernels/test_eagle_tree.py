"""EAGLE-2's tree kernels (kernels/eagle_tree.py) against plain Python:

- `select` keeps the same candidates, in the same order, as the proposers' best-first selection
  (proposer_service/tree_builder.select with no branching limit), ties included;
- growing levels with `first_level` / `next_level` records every candidate with the cumulative
  log-probability of its path, makes the k best children the frontier, and keeps each frontier
  node's fed ancestors (the rows it may attend to);
- the selected tree is a valid Draft: topological, siblings best first.
"""

from __future__ import annotations

import random

import pytest
import torch

from kernels.eagle_tree import TreeState, first_level, next_level, num_candidates, select
from proposer_service.tree_builder import select as select_reference
from splitspec.proposal import Draft


def random_tree(n: int, seed: int, ties: bool) -> tuple[list[int], list[float]]:
    """Candidates in topological order whose scores never rise from parent to child."""
    rng = random.Random(seed)
    parents, scores = [], []
    for i in range(n):
        p = rng.randrange(-1, i) if i else -1
        step = rng.choice([0.0, -0.5, -1.0]) if ties else -rng.random()
        parents.append(p)
        scores.append((0.0 if p < 0 else scores[p]) + step)
    return parents, scores


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("ties", [False, True])
def test_select_is_the_best_first_selection(seed, ties):
    parents, scores = random_tree(40, seed, ties)
    for budget in (1, 5, 17, 40):
        kept, local = select(torch.tensor(scores), torch.tensor(parents), budget)
        want = select_reference(parents, scores, budget, max_branch=len(parents))
        assert kept.tolist() == want
        at = {c: j for j, c in enumerate(want)}
        assert local.tolist() == [-1 if parents[c] < 0 else at[parents[c]] for c in want]


def expand_reference(logps: list[torch.Tensor], k: int):
    """Plain EAGLE-2 growth: candidates (token, parent, score) and each level's frontier."""
    tokens, parents, scores = [], [], []
    vals, ids = logps[0].topk(k)
    for v, t in zip(vals.tolist(), ids.tolist()):
        tokens.append(t)
        parents.append(-1)
        scores.append(v)
    frontier = list(range(k))
    frontiers = [frontier]
    for lp in logps[1:]:
        made = []
        for row, f in enumerate(frontier):
            vals, ids = lp[row].topk(k)
            for v, t in zip(vals.tolist(), ids.tolist()):
                tokens.append(t)
                parents.append(f)
                scores.append(scores[f] + v)
                made.append(len(tokens) - 1)
        frontier = sorted(made, key=lambda c: -scores[c])[:k]
        frontiers.append(frontier)
    return tokens, parents, scores, frontiers


@pytest.mark.parametrize("k,depth", [(1, 4), (2, 3), (4, 5)])
def test_levels_grow_as_eagle2_defines(k, depth):
    g = torch.Generator().manual_seed(k * 10 + depth)
    V = 30
    logps = [torch.randn(V, generator=g).log_softmax(-1)]
    logps += [torch.randn(k, V, generator=g).log_softmax(-1) for _ in range(depth - 1)]
    tokens, parents, scores, frontiers = expand_reference(logps, k)
    state = TreeState(k, depth, torch.device("cpu"))
    fed = first_level(state, logps[0])
    assert fed.tolist() == [tokens[c] for c in frontiers[0]]
    fed_nodes = [frontiers[0]]  # per level: the candidate each fed row holds
    for level in range(2, depth + 1):
        fed, rows = next_level(state, level, logps[level - 1])
        assert state.frontier.tolist() == frontiers[level - 1]
        assert fed.tolist() == [tokens[c] for c in frontiers[level - 1]]
        assert [fed_nodes[-1][r] for r in rows.tolist()] == [parents[c]
                                                             for c in frontiers[level - 1]]
        fed_nodes.append(frontiers[level - 1])
        # each frontier node marks the fed rows on its own path, itself included (it is fed
        # as the next level's row i)
        for i, c in enumerate(frontiers[level - 1]):
            path, p = {c}, parents[c]
            while p >= 0:
                path.add(p)
                p = parents[p]
            want = [fed_nodes[lv][r] in path for lv in range(level) for r in range(k)]
            want += [False] * (depth * k - len(want))
            assert state.ancestors[i].tolist() == want
    n = num_candidates(k, depth)
    assert state.tokens.tolist() == tokens[:n] and state.parents.tolist() == parents[:n]
    torch.testing.assert_close(state.scores, torch.tensor(scores[:n]))


def test_selected_tree_is_a_valid_draft():
    g = torch.Generator().manual_seed(3)
    k, depth, V = 3, 4, 25
    state = TreeState(k, depth, torch.device("cpu"))
    first_level(state, torch.randn(V, generator=g).log_softmax(-1))
    for level in range(2, depth + 1):
        next_level(state, level, torch.randn(k, V, generator=g).log_softmax(-1))
    for budget in (1, 4, 9, num_candidates(k, depth)):
        kept, local = select(state.scores, state.parents, budget)
        draft = Draft("s", state.tokens[kept].tolist(), parents=local.tolist())
        assert draft.tree_error(budget, k) is None
        sc = state.scores[kept].tolist()
        for i, p in enumerate(local.tolist()):  # siblings best first, children after parents
            later = [j for j in range(i + 1, len(sc)) if local[j] == p]
            assert all(sc[j] <= sc[i] for j in later)
            assert p < i
