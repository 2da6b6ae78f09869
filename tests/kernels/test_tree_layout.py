"""kernels/tree_layout.py builds on the device what kernels/layout.py builds on the host from
lists: every fed row's position, parent and ancestors, for random steps of chains and trees
(several uncached tokens before the root, trees of any shape, chains, sequences without drafts)."""

from __future__ import annotations

import random

import planted_bugs as bug
import pytest
import torch

from kernels.layout import StepLayout
from kernels.tree_layout import tree_rows


def random_step(rng: random.Random):
    b = rng.randint(1, 5)
    k = [rng.choice([0, 1, 3, rng.randint(0, 12)]) for _ in range(b)]
    new = [rng.choice([1, 1, 1, rng.randint(1, 4)]) for _ in range(b)]
    start = [rng.randint(0, 60) for _ in range(b)]
    parents = [[rng.randint(-1, d - 1) if rng.random() < 0.8 else d - 1 for d in range(n)]
               for n in k]
    return new, k, start, parents


def check_equals_the_host(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(40):
        new, k, start, parents = random_step(rng)
        q = [u + n for u, n in zip(new, k)]
        host = StepLayout.build(q, start, k, [True] * len(q), parents)
        max_q, max_k = max(q), max(max(k), 1)
        padded = torch.full((len(q), max_k), -7, dtype=torch.int64)  # past k: ignored
        for i, p in enumerate(parents):
            padded[i, :len(p)] = torch.tensor(p, dtype=torch.int64)
        pos, par, anc = tree_rows(torch.tensor(q), torch.tensor(k), torch.tensor(start), padded,
                                  max_q)
        valid = torch.arange(max_q)[None, :] < torch.tensor(q)[:, None]
        assert torch.equal(pos[valid], host.query_positions)
        assert torch.equal(par[valid], host.parents)
        want = host.ancestors
        if want is None:  # every sequence a chain: the causal relation
            want = torch.zeros(len(q), max_q, max_q, dtype=torch.bool)
            for i, n in enumerate(q):
                want[i, :n, :n] = torch.tril(torch.ones(n, n, dtype=torch.bool))
        assert torch.equal(anc, want)
        assert not pos[~valid].any() and bool((par[~valid] == -1).all())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_device_rows_equal_the_hosts_for_random_trees(seed):
    check_equals_the_host(seed)


def test_the_check_catches_a_mask_without_its_ancestors_further_up(monkeypatch):
    bug.tree_mask_without_closure(monkeypatch)
    with pytest.raises(AssertionError):
        check_equals_the_host(0)


def test_nothing_is_read_back_to_the_host(monkeypatch):
    """Every op stays a tensor op on the inputs' device: the function runs under a guard that
    fails any conversion of a tensor to a Python number."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("read back to the host")

    q, k = torch.tensor([4, 3]), torch.tensor([3, 0])
    for name in ("item", "tolist", "__bool__", "__int__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    pos, _, anc = tree_rows(q, k, torch.tensor([10, 5]), torch.tensor([[-1, -1, 0], [9, 9, 9]]), 4)
    monkeypatch.undo()
    assert pos.tolist() == [[10, 11, 11, 12], [5, 6, 7, 0]]
    assert anc[0, 3].tolist() == [True, True, False, True]
