"""The tree sampler fed its trees' parents as a tensor (kernels/tree_rejection.py DeviceParents:
a head's tree left on the device, the walk shaped by host bounds) gives what it gives for the
same trees as host lists: the same tokens, accepted counts and paths, for random trees of random
batches with greedy, seeded and sampled rows (the same random numbers: one seed for both runs),
one-hot and sparse q; bounds looser than the trees change nothing."""

from __future__ import annotations

import random

import planted_bugs as bug
import pytest
import torch

from kernels.layout import StepLayout
from kernels.sparse_probs import SparseProbs
from kernels.tree_rejection import DeviceParents, tree_rejection_sample

VOCAB = 12  # small: drafts are often accepted, paths go deep


def _depth_and_width(parents: list[int]) -> tuple[int, int]:
    depth, count = [0] * (len(parents) + 1), [0] * (len(parents) + 1)
    for d, p in enumerate(parents):
        depth[d + 1] = depth[p + 1] + 1
        count[p + 1] += 1
    return max(depth), max(count)


def random_batch(rng: random.Random):
    b = rng.randint(1, 4)
    ks = [rng.choice([0, 1, 3, rng.randint(1, 9)]) for _ in range(b)]
    ks[rng.randrange(b)] = rng.randint(1, 9)  # a step with trees has a node somewhere
    parents = [[rng.randint(-1, d - 1) if rng.random() < 0.7 else d - 1 for d in range(k)]
               for k in ks]
    greedy = [rng.random() < 0.3 for _ in range(b)]
    seeds = [rng.choice([None, rng.randint(0, 99)]) for _ in range(b)]
    return ks, parents, greedy, seeds


def check_device_parents_match_host_parents(seed: int, sparse_q: bool) -> None:
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    for _ in range(25):
        ks, parents, greedy, seeds = random_batch(rng)
        layout = StepLayout.for_drafts(ks, [rng.randint(1, 40) for _ in ks])
        rows, d = sum(k + 1 for k in ks), sum(ks)
        probs = torch.softmax(3 * torch.randn(rows, VOCAB, generator=g), -1)
        ids = torch.randint(0, VOCAB, (d,), generator=g)
        q = None
        if sparse_q and d:
            idx = torch.stack([torch.randperm(VOCAB, generator=g)[:3] for _ in range(d)])
            idx[:, 0] = ids
            q = SparseProbs(idx, torch.softmax(torch.randn(d, 3, generator=g), -1))
        shapes = [_depth_and_width(p) for p in parents]
        bounds = DeviceParents(torch.tensor([x for p in parents for x in p], dtype=torch.int64),
                               max((s[0] for s in shapes), default=0) + rng.randint(0, 2),
                               max((s[1] for s in shapes), default=1) + rng.randint(0, 2))
        torch.manual_seed(seed)
        host = tree_rejection_sample(probs, ids, parents, layout, q, greedy, seeds,
                                     impl="reference")
        torch.manual_seed(seed)
        dev = tree_rejection_sample(probs, ids, bounds, layout, q, greedy, seeds, impl="reference")
        assert host.tokens() == dev.tokens(), (ks, parents, greedy, seeds)
        assert host.paths() == dev.paths()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("sparse_q", [False, True])
def test_device_parents_verify_what_host_parents_verify(seed, sparse_q):
    check_device_parents_match_host_parents(seed, sparse_q)


def test_the_check_catches_sibling_ranks_counted_across_sequences(monkeypatch):
    bug.device_tree_ranks_across_sequences(monkeypatch)
    with pytest.raises(AssertionError):
        for seed in range(3):
            check_device_parents_match_host_parents(seed, False)
