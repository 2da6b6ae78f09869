"""The step layout's per-row indices for chains and trees against a dense reference computed by
walking parent pointers, and the attention mask built from them (verifier_service/
paged_attention.py) against the same reference."""

from __future__ import annotations

import random

import pytest
import torch

from kernels.layout import StepLayout
from verifier_service.kv.paged_attention import PagedBatch
from verifier_service.step.plan import plan_step


def _reference(num_new, ks, starts, parents):
    """Per sequence, by brute force: each fed row's parent chain up to the cache."""
    out = []
    for n, k, s, given in zip(num_new, ks, starts, parents):
        par = [j - 1 for j in range(n)]
        for d in range(k):
            p = given[d] if given is not None else d - 1
            par.append(n - 1 if p == -1 else n + p)
        rows = []
        for j in range(n + k):
            chain, a = [], j
            while a >= 0:
                chain.append(a)
                a = par[a]
            depth = len(chain) - 1  # row 0 sits at the start position
            rows.append((s + depth, par[j], set(chain)))
        out.append(rows)
    return out


def _random_step(rng, trees: bool):
    b = rng.randint(1, 4)
    emits = [rng.random() < 0.8 for _ in range(b)]
    num_new = [rng.choice([1, 1, 2, 5]) for _ in range(b)]
    ks = [rng.randint(0, 5) if e else 0 for e in emits]
    starts = [rng.randint(0, 9) for _ in range(b)]
    parents = [[rng.randint(-1, d - 1) for d in range(k)] if trees and rng.random() < 0.7
               else None for k in ks]
    return num_new, ks, starts, emits, parents


@pytest.mark.parametrize("trees", [False, True], ids=["chains", "trees"])
def test_positions_parents_and_ancestors_match_a_walk_of_the_tree(trees):
    rng = random.Random(3)
    for _ in range(200):
        num_new, ks, starts, emits, parents = _random_step(rng, trees)
        layout = StepLayout.build([n + k for n, k in zip(num_new, ks)], starts, ks, emits,
                                  parents)
        ref = _reference(num_new, ks, starts, parents)
        flat = [r for rows in ref for r in rows]
        assert layout.positions().tolist() == [p for p, _, _ in flat]
        assert layout.parents.tolist() == [p for _, p, _ in flat]
        max_q = max(n + k for n, k in zip(num_new, ks))
        dense = torch.zeros(len(ks), max_q, max_q, dtype=torch.bool)
        for i, rows in enumerate(ref):
            for j, (_, _, seen) in enumerate(rows):
                dense[i, j, sorted(seen)] = True
        if layout.chain:  # the causal relation, which the attention path builds by arithmetic
            causal = torch.ones(max_q, max_q, dtype=torch.bool).tril()
            lens = torch.tensor([n + k for n, k in zip(num_new, ks)])
            valid = torch.arange(max_q) < lens[:, None]
            assert torch.equal(dense, causal & valid[:, :, None] & valid[:, None, :])
        else:
            assert torch.equal(layout.ancestors, dense)


def test_a_chain_given_as_parents_is_the_chain():
    chain = StepLayout.build([4, 3], [7, 2], [3, 2], [True, True], [[-1, 0, 1], None])
    plain = StepLayout.build([4, 3], [7, 2], [3, 2], [True, True])
    assert torch.equal(chain.positions(), plain.positions())
    assert torch.equal(chain.parents, plain.parents)
    assert chain.chain and plain.chain and chain.ancestors is None  # the causal fast path


@pytest.mark.parametrize("parents, why", [
    ([[0, -1]], "not in"),  # a node before its parent (or itself: a cycle)
    ([[-1, 1]], "not in"),
    ([[-2, 0]], "not in"),
    ([[-1]], "draft parents for"),
    ([[-1, 0], None], "one entry"),
])
def test_bad_parents_are_refused(parents, why):
    with pytest.raises(ValueError, match=why):
        StepLayout.build([3], [5], [2], [True], parents)


@pytest.mark.parametrize("trees", [False, True], ids=["chains", "trees"])
@pytest.mark.parametrize("window", [None, 3])
def test_attention_mask_matches_a_dense_reference(trees, window):
    rng = random.Random(11)
    for _ in range(100):
        num_new, ks, starts, emits, parents = _random_step(rng, trees)
        q = [n + k for n, k in zip(num_new, ks)]
        layout = StepLayout.build(q, starts, ks, emits, parents)
        ref = _reference(num_new, ks, starts, parents)
        # one-slot blocks, each sequence's a run of distinct ids
        tables, at = [], 0
        for s, n in zip(starts, q):
            tables.append(list(range(at, at + s + n)))
            at += s + n
        plan = plan_step(layout, [0] * sum(q), tables, 1, at)
        batch = PagedBatch.from_plan(None, None, plan.fields.views(plan.host), plan, 1)
        mask = batch.mask(window)[:, 0]  # [B, max_q, max_ctx]
        max_ctx = max(s + n for s, n in zip(starts, q))
        for i, rows in enumerate(ref):
            s = starts[i]
            key_pos = list(range(s)) + [p for p, _, _ in rows]
            for j, (pos, _, seen) in enumerate(rows):
                want = [c < s or (c - s < len(rows) and c - s in seen) for c in range(max_ctx)]
                if window:
                    want = [w and c < len(key_pos) and key_pos[c] > pos - window
                            for c, w in enumerate(want)]
                assert mask[i, j].tolist() == want, (i, j)
