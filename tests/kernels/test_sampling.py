"""apply_sampling_params against a per-row naive implementation; sample() seeding and
distribution."""

from __future__ import annotations

import math

import pytest
import torch

import kernels.sampling as sampling_mod
from kernels import SamplingTensors, apply_sampling_params, noise_key, sample


def naive_row(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float
) -> torch.Tensor:
    """One row, in the documented order: temperature, top-k, top-p, min-p."""
    v = logits.shape[0]
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(), v).to(torch.float32)
    x = logits.to(torch.float32) / temperature
    keep = torch.ones(v, dtype=torch.bool)
    if 0 < top_k < v:
        kth = torch.sort(x, descending=True).values[top_k - 1]
        keep &= x >= kth
    if top_p < 1.0:
        p = torch.softmax(torch.where(keep, x, torch.tensor(float("-inf"))), -1)
        order = torch.argsort(p, descending=True, stable=True)
        mass = 0.0
        keep_p = torch.zeros(v, dtype=torch.bool)
        for idx in order.tolist():
            if mass >= top_p and keep_p.any():
                break
            keep_p[idx] = True
            mass += float(p[idx])
        keep &= keep_p
    p = torch.softmax(torch.where(keep, x, torch.tensor(float("-inf"))), -1)
    if min_p > 0:
        p = torch.where(p >= min_p * p.max(), p, torch.zeros_like(p))
        p = p / p.sum()
    return p


def param_grid(n: int, gen: torch.Generator) -> SamplingTensors:
    temps = [0.0, 1.0, 0.5, 1.7]
    ks = [0, 1, 5, 40, -1]
    ps = [1.0, 0.9, 0.5, 0.05]
    mps = [0.0, 0.1, 0.3]
    pick = lambda xs: [xs[int(i)] for i in torch.randint(len(xs), (n,), generator=gen)]  # noqa: E731
    return SamplingTensors.from_lists(pick(temps), pick(ks), pick(ps), pick(mps))


def test_matches_naive_rows():
    gen = torch.Generator().manual_seed(0)
    n, v = 200, 50
    logits = torch.randn(n, v, generator=gen) * 3
    params = param_grid(n, gen)
    got = params.apply(logits)
    assert got.dtype == torch.float32 and got.shape == (n, v)
    for i in range(n):
        exp = naive_row(
            logits[i],
            float(params.temperature[i]),
            int(params.top_k[i]),
            float(params.top_p[i]),
            float(params.min_p[i]),
        )
        torch.testing.assert_close(got[i], exp, atol=1e-6, rtol=1e-5, msg=f"row {i}")


def test_device_path_without_host_shortcuts(monkeypatch):
    # parameter tensors on an accelerator skip the "does any row use this?" checks; same result
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(64, 30, generator=gen)
    params = param_grid(64, gen)
    expected = params.apply(logits)
    monkeypatch.setattr(sampling_mod, "_host_any", lambda mask: True)
    torch.testing.assert_close(params.apply(logits), expected)
    # and with every stage disabled, all stages running still gives plain softmax
    off = SamplingTensors.from_lists([1.0] * 4)
    x = torch.randn(4, 30, generator=gen)
    torch.testing.assert_close(off.apply(x), torch.softmax(x, -1))


def test_top_k_only_path_matches_sort_path(monkeypatch):
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(32, 100, generator=gen)
    params = SamplingTensors.from_lists(
        [0.8] * 32, [int(k) for k in torch.randint(0, 101, (32,), generator=gen)]
    )
    expected = params.apply(logits)  # top-k via topk(max k)
    monkeypatch.setattr(sampling_mod, "_host_any", lambda mask: True)  # top-k via the sort path
    torch.testing.assert_close(params.apply(logits), expected)
    assert ((expected > 0).sum(-1) == torch.where(params.top_k > 0, params.top_k, 100)).all()


def test_greedy_rows_are_one_hot_and_ties_in_top_k_are_kept():
    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0], [1.0, 3.0, 2.0, 3.0]])
    probs = apply_sampling_params(
        logits,
        torch.tensor([0.0, 1.0]),
        torch.tensor([0, 1]),
        torch.tensor([1.0, 1.0]),
        torch.tensor([0.0, 0.0]),
    )
    assert probs[0].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert probs[1, 1] == probs[1, 3] == pytest.approx(0.5)


def test_top_p_keeps_most_likely_token_even_for_tiny_p():
    logits = torch.tensor([[0.0, 5.0, 1.0]])
    probs = apply_sampling_params(
        logits, torch.tensor([1.0]), torch.tensor([0]), torch.tensor([1e-6]), torch.tensor([0.0])
    )
    assert probs.tolist() == [[0.0, 1.0, 0.0]]


def test_sample_seeded_rows_independent_of_batch():
    gen = torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn(6, 500, generator=gen), -1)
    alone = [int(sample(probs[i : i + 1], [noise_key(i, 4)])) for i in range(6)]
    for mask in ([1, 1, 1, 1, 1, 1], [1, 0, 1, 0, 1, 0], [0, 0, 0, 1, 0, 0]):
        keys = [noise_key(i, 4) if m else None for i, m in enumerate(mask)]
        got = sample(probs, keys).tolist()
        assert [g for g, m in zip(got, mask) if m] == [a for a, m in zip(alone, mask) if m]


def test_sample_distribution_and_zero_probability():
    gen = torch.Generator().manual_seed(4)
    p = torch.tensor([0.0, 0.1, 0.2, 0.0, 0.7])
    n = 40_000
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        toks = sample((p * 3).expand(n, -1).contiguous(), [None] * n)  # rows need not be normalised
    hist = torch.bincount(toks, minlength=5).float() / n
    assert hist[0] == 0 and hist[3] == 0
    # 5 sigma binomial bounds
    sigma = (p * (1 - p) / n).sqrt()
    assert ((hist - p).abs() <= 5 * sigma + 1e-9).all(), hist
    with pytest.raises(ValueError):
        sample(p.unsqueeze(0), [None, None])
    del gen


def test_keyed_noise_is_exponential_and_a_pure_function_of_key_and_token():
    from kernels.sampling import keyed_exponentials, noise_key

    idx = torch.arange(200_000).reshape(2, -1)
    e = keyed_exponentials([noise_key(3, 10), noise_key(3, 11)], idx)
    # Exp(1): mean 1, variance 1, P(E > 1) = 1/e (each within 5 sigma of 100k draws)
    for row in e:
        assert abs(float(row.mean()) - 1) < 5 * (1 / 100_000) ** 0.5
        assert abs(float(row.var()) - 1) < 5 * (8 / 100_000) ** 0.5
        frac = float((row > 1).float().mean())
        assert abs(frac - math.exp(-1)) < 5 * (0.25 / 100_000) ** 0.5
    # the two positions' noise is uncorrelated, and a subset of token ids reads the same numbers
    assert abs(float(torch.corrcoef(e)[0, 1])) < 0.02
    assert torch.equal(
        keyed_exponentials([noise_key(3, 10)], torch.tensor([[5, 17]])), e[0, [5, 17]].unsqueeze(0)
    )


def test_keyed_sampling_matches_the_distribution():
    p = torch.tensor([0.05, 0.15, 0.0, 0.3, 0.5])
    n = 40_000
    toks = sample(p.expand(n, -1).contiguous(), [noise_key(99, t) for t in range(n)])
    hist = torch.bincount(toks, minlength=5).float() / n
    sigma = (p * (1 - p) / n).sqrt()
    assert hist[2] == 0
    assert ((hist - p).abs() <= 5 * sigma + 1e-9).all(), hist


def test_a_tiny_temperature_samples_at_the_floor_not_nan():
    from kernels.sampling import MIN_TEMPERATURE, apply_sampling_params

    logits = (torch.randn(1, 50) * 5).repeat(3, 1)
    t = torch.tensor([1e-38, MIN_TEMPERATURE, 0.5])
    p = apply_sampling_params(logits, t, torch.zeros(3, dtype=torch.long), torch.ones(3),
                              torch.zeros(3))
    assert torch.isfinite(p).all() and torch.equal(p[0], p[1])
    assert torch.equal(p[2], (logits[2] / 0.5).softmax(-1))
