"""Statistical losslessness: the rejection sampler's output converges to the target distribution.

Method: run N independent copies of one speculative step (same p, same q, drafts really sampled
from q) as one batch; take the empirical histogram of the first emitted token over the first N
runs, N = 10 .. 100000, and its total-variation distance to p and to an unrelated distribution.
A lossless sampler's distance to p falls like 1/sqrt(N) (log-log slope ~ -1/2, ratio ~ sqrt(1000)
between N = 100 and N = 100000) while the distance to the unrelated distribution stays flat. A
negative control (acceptance told the wrong q) shows that the test does catch a biased sampler.
Sizes keep the whole module to a few seconds on two CPU cores; all seeds are fixed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from kernels import SparseProbs, rejection_sample
from kernels.sampling import keyed_argmax, noise_key

NS = [10, 100, 1_000, 10_000, 100_000]


@dataclass
class Step:
    p: torch.Tensor  # [k + 1, V] target rows of one sequence
    q_dense: (
        torch.Tensor | None
    )  # [k, V] the distribution the drafts are sampled from (None: fixed drafts)
    q_given: object  # what the sampler is told: None | dense [k, V] | SparseProbs [k, K]


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


def expected_tv_noise(p: torch.Tensor, n: int) -> float:
    # E|X/n - p_i| ~ sqrt(2 p_i (1 - p_i) / (pi n)) for binomial counts
    return 0.5 * float(torch.sqrt(2 * p * (1 - p) / (math.pi * n)).sum())


def slope(ns: list[int], ds: list[float]) -> float:
    xs = [math.log(n) for n in ns]
    ys = [math.log(max(d, 1e-12)) for d in ds]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def run_many(
    step: Step,
    k: int,
    n: int,
    gen: torch.Generator,
    fixed_drafts: torch.Tensor | None = None,
    seeds: list[int] | None = None,
):
    """n copies of the step as one ragged batch -> emitted tokens [n, k + 1] and num_accepted
    [n]."""
    vocab = step.p.shape[1]
    target = step.p.repeat(n, 1)  # [n (k + 1), V]
    if fixed_drafts is not None:
        drafts = fixed_drafts.repeat(n) if fixed_drafts.numel() == k else fixed_drafts
    elif isinstance(step.q_given, SparseProbs):
        pick = torch.multinomial(step.q_given.probs.repeat(n, 1), 1, generator=gen).squeeze(1)
        drafts = step.q_given.indices.repeat(n, 1).gather(1, pick.unsqueeze(1)).squeeze(1)
    elif step.q_dense is not None:
        drafts = torch.multinomial(step.q_dense.repeat(n, 1), 1, generator=gen).squeeze(1)
    else:
        drafts = torch.randint(vocab, (n * k,), generator=gen)
    if isinstance(step.q_given, SparseProbs):
        q = SparseProbs(step.q_given.indices.repeat(n, 1), step.q_given.probs.repeat(n, 1))
    elif step.q_given is not None:
        q = step.q_given.repeat(n, 1)
    else:
        q = None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch.randint(2**31, (1,), generator=gen)))
        res = rejection_sample(
            target, drafts, torch.full((n,), k), q, torch.zeros(n, dtype=torch.bool), seeds
        )
    return res.output_token_ids, res.num_accepted


def distances(samples: torch.Tensor, p: torch.Tensor, ref: torch.Tensor):
    vocab = p.shape[0]
    d_p, d_ref = [], []
    for n in NS:
        hist = torch.bincount(samples[:n], minlength=vocab).to(torch.float64) / n
        d_p.append(tv(hist, p.double()))
        d_ref.append(tv(hist, ref.double()))
    return d_p, d_ref


def unrelated_to(p: torch.Tensor) -> torch.Tensor:
    """Same values as p on other tokens: the most likely token of p gets the least mass, and so
    on."""
    ref = torch.empty_like(p)
    ref[p.argsort(descending=True)] = p.sort().values
    return ref


def assert_converges(samples: torch.Tensor, p: torch.Tensor) -> None:
    ref = unrelated_to(p)
    true_ref = tv(p, ref)
    assert true_ref > 0.2, true_ref
    d_p, d_ref = distances(samples, p, ref)
    ratio = (
        d_p[1] / d_p[-1]
    )  # N = 100 vs N = 100000: ~ sqrt(1000) = 31.6, within a generous factor 5
    assert math.sqrt(1000) / 5 < ratio < math.sqrt(1000) * 5, (d_p, ratio)
    s = slope(NS, d_p)
    assert -0.7 < s < -0.35, (d_p, s)
    assert d_p[-1] < 2.5 * expected_tv_noise(p, NS[-1]), (d_p, expected_tv_noise(p, NS[-1]))
    # distance to the unrelated distribution: flat, at TV(p, ref) up to sampling noise
    assert abs(slope(NS[1:], d_ref[1:])) < 0.1, d_ref
    for n, d in zip(NS[1:], d_ref[1:]):
        assert abs(d - true_ref) < 4 * expected_tv_noise(ref, n) + 0.01, (d_ref, true_ref)


def make_step(vocab: int, k: int, mode: str, gen: torch.Generator, top: int = 5) -> Step:
    p = torch.softmax(
        2.0 * torch.randn(k + 1, vocab, generator=gen, dtype=torch.float64), -1
    ).float()
    if mode == "dense":
        q = torch.softmax(
            2.0 * torch.randn(k, vocab, generator=gen, dtype=torch.float64), -1
        ).float()
        return Step(p, q, q)
    if mode == "sparse":
        idx = torch.stack([torch.randperm(vocab, generator=gen)[:top] for _ in range(k)])
        pr = torch.softmax(torch.randn(k, top, generator=gen, dtype=torch.float64), -1).float()
        return Step(p, None, SparseProbs(idx, pr))
    return Step(p, None, None)


@pytest.mark.parametrize(
    "vocab,k,mode",
    [
        (10, 1, "dense"),
        (20, 3, "dense"),
        (50, 2, "dense"),
        (30, 2, "sparse"),
        (12, 4, "sparse"),
        (25, 4, "one_hot"),
        (40, 1, "one_hot"),
    ],
)
def test_first_token_converges_to_target(vocab, k, mode):
    check_first_token_converges(vocab, k, mode)


def check_first_token_converges(vocab: int, k: int, mode: str) -> None:
    gen = torch.Generator().manual_seed(1000 * vocab + 10 * k + len(mode))
    step = make_step(vocab, k, mode, gen)
    out, _ = run_many(step, k, NS[-1], gen)
    assert_converges(out[:, 0], step.p[0])


def test_one_hot_fixed_drafts_converge():
    # deterministic proposer (e.g. n-gram): the same draft every time, still lossless
    gen = torch.Generator().manual_seed(5)
    step = make_step(16, 3, "one_hot", gen)
    fixed = step.p[:3].argsort(dim=-1)[:, -2]  # a plausible but not the best token
    out, _ = run_many(step, 3, NS[-1], gen, fixed_drafts=fixed)
    assert_converges(out[:, 0], step.p[0])


def check_every_position_converges(seeded: bool = False) -> None:
    """With position-independent target rows, the j-th emitted token, among runs that emitted it,
    is ~ p_j: j = 1 .. k - 1 after accepted drafts, and j = k, the bonus row after all k."""
    gen = torch.Generator().manual_seed(6)
    vocab, k = 8, 3
    p = torch.softmax(0.5 * torch.randn(k + 1, vocab, generator=gen), -1)
    q = (0.5 * p + 0.5 * torch.softmax(torch.randn(k + 1, vocab, generator=gen), -1))[:k]
    n = 400_000
    drafts = None
    if seeded:  # drafted as the proposers do: with the same keyed noise (position 1 + j)
        keys = [noise_key(i, 1 + j) for i in range(n) for j in range(k)]
        drafts = keyed_argmax(q.repeat(n, 1), keys)
    out, n_acc = run_many(
        Step(p, q, q), k, n, gen, fixed_drafts=drafts, seeds=list(range(n)) if seeded else None
    )
    assert_converges(out[:, 0], p[0])
    for j in range(1, k + 1):
        samples = out[n_acc >= j, j]
        assert samples.numel() >= NS[-1], (j, samples.numel())
        assert_converges(samples, p[j])


def test_every_position_converges_including_the_bonus():
    check_every_position_converges()


@pytest.mark.soak  # 100,000 seeded rows: the soak tier
def test_seeded_rows_converge_to_target():
    # seeded rows are sampled by keyed noise (one key per seed and position): across seeds each
    # position is distributed as p, the bonus row included
    check_every_position_converges(seeded=True)


def test_negative_control_wrong_q_is_detected():
    # drafts sampled from q_true but acceptance told another q: biased, and the test must see it
    gen = torch.Generator().manual_seed(7)
    vocab, k = 20, 2
    step = make_step(vocab, k, "dense", gen)
    wrong = torch.softmax(2.0 * torch.randn(k, vocab, generator=gen), -1)
    out, _ = run_many(Step(step.p, step.q_dense, wrong), k, NS[-1], gen)
    d_p, _ = distances(out[:, 0], step.p[0], step.p[0])
    assert d_p[-1] > 5 * expected_tv_noise(step.p[0], NS[-1]), d_p
    assert slope(NS[2:], d_p[2:]) > -0.3, d_p  # the distance plateaus instead of falling
