"""Typical acceptance (opt-in, not lossless): threshold rule, format, greedy parity, seeding."""

from __future__ import annotations

import math

import torch
from kernels_testlib import random_batch

from kernels import PLACEHOLDER_TOKEN_ID, rejection_sample, typical_acceptance_sample

V = 12


def naive_accepts(p: torch.Tensor, d: int, threshold: float, alpha: float) -> bool:
    entropy = -sum(float(x) * math.log(float(x)) for x in p if float(x) > 0)
    return float(p[d]) > min(threshold, alpha * math.exp(-entropy))


def test_threshold_rule_matches_naive():
    gen = torch.Generator().manual_seed(0)
    ks = [3, 0, 2, 4, 1]
    for sharp in (0.3, 1.0, 3.0):
        batch = random_batch(ks, V, "none", gen, sharpness=sharp)
        res = typical_acceptance_sample(
            batch.target_probs,
            batch.draft_token_ids,
            batch.num_draft_tokens,
            batch.is_greedy,
            [None] * len(ks),
            0.09,
            0.3,
        )
        t_off = d_off = 0
        for i, k in enumerate(ks):
            n = 0
            while n < k and naive_accepts(
                batch.target_probs[t_off + n], int(batch.draft_token_ids[d_off + n]), 0.09, 0.3
            ):
                n += 1
            assert int(res.num_accepted[i]) == n
            row = res.output_token_ids[i].tolist()
            assert row[:n] == batch.draft_token_ids[d_off : d_off + n].tolist()
            assert row[n] >= 0 and all(t == PLACEHOLDER_TOKEN_ID for t in row[n + 1 :])
            t_off, d_off = t_off + k + 1, d_off + k


def test_greedy_rows_equal_rejection_sampler():
    gen = torch.Generator().manual_seed(1)
    ks = [2, 3, 0, 1]
    batch = random_batch(ks, V, "none", gen, greedy=[True] * 4)
    am = batch.target_probs.argmax(-1)
    batch.draft_token_ids[:2] = am[:2]  # row 0 accepts both drafts
    a = typical_acceptance_sample(
        batch.target_probs,
        batch.draft_token_ids,
        batch.num_draft_tokens,
        batch.is_greedy,
        [None] * 4,
    )
    b = rejection_sample(
        batch.target_probs,
        batch.draft_token_ids,
        batch.num_draft_tokens,
        None,
        batch.is_greedy,
        [None] * 4,
    )
    assert a.tokens() == b.tokens()
    assert a.tokens()[0] == [int(am[0]), int(am[1]), int(am[2])]


def test_seeded_rows_deterministic_and_batch_independent():
    gen = torch.Generator().manual_seed(2)
    ks = [2, 0, 3]
    batch = random_batch(ks, V, "none", gen, sharpness=0.2)
    seeds = [0, 1, 2]
    first = typical_acceptance_sample(
        batch.target_probs, batch.draft_token_ids, batch.num_draft_tokens, batch.is_greedy, seeds
    )
    again = typical_acceptance_sample(
        batch.target_probs, batch.draft_token_ids, batch.num_draft_tokens, batch.is_greedy, seeds
    )
    assert first.tokens() == again.tokens()
    alone = typical_acceptance_sample(
        batch.target_probs[3:4],
        torch.zeros(0, dtype=torch.long),
        torch.tensor([0]),
        torch.tensor([False]),
        [1],
    )
    assert alone.tokens()[0] == first.tokens()[1]


def test_not_lossless():
    # p = [0.5, 0.5, 0, ...], the draft always proposes token 0 (p = 0.5 > threshold): always
    # accepted,
    # so the first token is 0 every time although p gives it only half the mass
    p = torch.zeros(2, V)
    p[:, :2] = 0.5
    n = 200
    res = typical_acceptance_sample(
        p.repeat(n, 1),
        torch.zeros(n, dtype=torch.long),
        torch.ones(n, dtype=torch.long),
        torch.zeros(n, dtype=torch.bool),
        [None] * n,
    )
    assert (res.output_token_ids[:, 0] == 0).all()
