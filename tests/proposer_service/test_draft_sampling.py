"""proposer_service/sampling.py: a sampled draft token really is a sample of the q sent
with it (the one property rejection sampling needs from a proposer), for unseeded and seeded
requests."""

from __future__ import annotations

import pytest
import torch

from proposer_service.sampling import choose_tokens, draft_keys
from splitspec.params import SamplingParams


def check_tokens_come_from_the_q_sent(seeded: bool) -> None:
    """4000 draws from one state: each token's frequency matches the q sent with it (5 sigma),
    and no token outside q's support is ever drawn."""
    logits = torch.tensor([[2.0, 1.6, 1.2, 0.8, 0.4, 0.0, -5.0, -9.0]])
    params = [SamplingParams(temperature=0.8, top_p=0.99, seed=3 if seeded else None)]
    n = 4000
    counts = torch.zeros(logits.shape[1])
    torch.manual_seed(0)
    for pos in range(n):
        tokens, rows = choose_tokens(logits, params, draft_keys(params, [pos]), top_k=6)
        counts[tokens[0]] += 1
    indices, probs = rows[0]
    q = torch.zeros(logits.shape[1])
    q[torch.tensor(indices)] = torch.tensor(probs)
    assert abs(float(q.sum()) - 1) < 1e-5
    freq = counts / n
    sigma = (q * (1 - q) / n).sqrt()
    assert (counts[q == 0] == 0).all(), counts
    assert ((freq - q).abs() <= 5 * sigma + 1e-9).all(), (freq, q)


@pytest.mark.parametrize("seeded", [False, True])
def test_sampled_draft_tokens_come_from_the_q_sent_with_them(seeded):
    check_tokens_come_from_the_q_sent(seeded)


def test_greedy_rows_send_ids_only():
    logits = torch.randn(3, 20)
    params = [SamplingParams(temperature=0.0)] * 3
    tokens, rows = choose_tokens(logits, params, draft_keys(params, [5, 6, 7]), top_k=4)
    assert tokens == logits.argmax(-1).tolist() and rows == [None, None, None]
