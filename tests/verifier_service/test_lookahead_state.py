"""A lookahead sequence's state on its own (verifier_service/methods/lookahead.py): the pool is
bounded and most-recent-first, the drafted tree is candidates then the window within the node
budget, and a window driven by a deterministic greedy 'target' through many steps finds and
proposes the target's repeating continuation (the Jacobi window converges and its n-grams reach the
pool)."""

from __future__ import annotations

from verifier_service.methods.lookahead import LookaheadShape, LookaheadState, NGramPool


def test_pool_keeps_the_most_recent_continuations_per_key_and_bounds_keys():
    pool = NGramPool(3, per_key=2, max_keys=2)
    for gram in [(1, 2, 3), (1, 4, 5), (1, 2, 3), (1, 6, 7)]:
        pool.add(gram)
    assert pool.get(1) == [(6, 7), (2, 3)]
    pool.add((8, 9, 9))
    pool.add((10, 11, 12))  # a third key evicts the least recently touched one (1)
    assert pool.get(1) == [] and pool.get(8) == [(9, 9)] and len(pool) == 2
    pool.add((1, 2))  # wrong size: ignored
    assert pool.get(1) == []


def test_the_tree_is_candidates_then_the_window_within_the_budget():
    shape = LookaheadShape(window=3, ngram=3, guesses=2)
    prompt = [5, 6, 7, 5, 6, 8, 5]
    state = LookaheadState(shape, prompt, "r1")
    draft = state.propose(prompt, budget=20)
    assert draft.num_candidates == 3  # (6, 8) and (6, 7) share the 6
    assert draft.tokens[:3] == [6, 8, 7] and draft.parents[:3] == [-1, 0, 0]
    assert draft.window_levels == 1 and len(draft.tokens) == 3 + 3
    assert all(p < i for i, p in enumerate(draft.parents))
    small = state.propose(prompt, budget=2)  # the window does not fit: candidates only
    assert small.window_levels == 0 and small.tokens == [6, 8]


def _target(tokens) -> int:
    """Greedy 'model': continues a fixed cycle from the last token."""
    cycle = [11, 12, 13, 14, 15, 16, 17]
    t = tokens[-1]
    return cycle[(cycle.index(t) + 1) % len(cycle)] if t in cycle else 11


def _argmax_per_node(history, draft):
    out = []
    for i in range(len(draft.tokens)):
        path, a = [], i
        while a != -1:
            path.append(draft.tokens[a])
            a = draft.parents[a]
        out.append(_target(list(history) + path[::-1]))
    return out


def test_a_window_driven_by_the_target_learns_its_continuations():
    shape = LookaheadShape(window=4, ngram=4, guesses=3)
    history = [1, 2, 3, 11]
    state = LookaheadState(shape, history, "r2")
    accepted_after = []
    for _ in range(12):
        draft = state.propose(history, budget=shape.max_nodes)
        argmax = _argmax_per_node(history, draft)
        # greedy acceptance over the candidate trie: longest path matching the target
        emitted, node = [], -1
        while True:
            kids = [i for i, p in enumerate(draft.parents[:draft.num_candidates]) if p == node]
            want = _target(history + emitted)
            nxt = next((i for i in kids if draft.tokens[i] == want), None)
            emitted.append(want)
            if nxt is None:
                break
            node = nxt
        accepted_after.append(len(emitted) - 1)
        history = history + emitted
        state.observe(emitted, argmax, history)
    # early steps accept nothing; once window n-grams reach the pool, whole candidates are taken
    assert accepted_after[0] == 0
    assert max(accepted_after[-4:]) == shape.ngram - 1
