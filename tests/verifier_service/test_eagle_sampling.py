"""A sampled EAGLE chain (verifier_service/eagle_head.py, sampled_chain) carries exactly the q
each token was drawn from: the request's sampling parameters applied to the head's own logits,
truncated to its top tokens, indices in the target's vocabulary. Drawn tokens follow that q
(unseeded, and seeded over positions), and a seeded chain is a function of (seed, position)."""

from __future__ import annotations

import pytest
import torch
from eagle_testlib import PROMPT_TOKENS, eagle3_sequence

from kernels.sampling import apply_sampling_params
from splitspec.params import SamplingParams

TOP_K = 8


@pytest.fixture(scope="module")
def seq():
    return eagle3_sequence(PROMPT_TOKENS)


def expected_q(seq, params: SamplingParams) -> torch.Tensor:
    """q over the target vocabulary from the root's logits, written out from the definition."""
    head = seq.head
    probs = apply_sampling_params(seq.root_logits[None].float(),
                                  torch.tensor([params.temperature]), torch.tensor([params.top_k]),
                                  torch.tensor([params.top_p]), torch.tensor([params.min_p]))[0]
    vals, idx = probs.topk(TOP_K)
    q = torch.zeros(head.spec.vocab_size)
    q[head.target_ids(idx)] = vals / vals.sum()
    return q


def check_tokens_come_from_the_q_sent(seq, seeded: bool, n: int = 800) -> None:
    params = SamplingParams(temperature=1.5, top_p=0.98, seed=11 if seeded else None)
    want = expected_q(seq, params)
    counts = torch.zeros_like(want)
    torch.manual_seed(0)
    for i in range(n):
        draft = seq.sampled_chain(1, params, first_position=100 + i, top_k=TOP_K)
        idx, probs = draft.q.rows()[0]
        q = torch.zeros_like(want)
        q[torch.tensor(idx)] = torch.tensor(probs)
        torch.testing.assert_close(q, want)
        counts[draft.tokens[0]] += 1
    freq = counts / n
    sigma = (want * (1 - want) / n).sqrt()
    assert (counts[want == 0] == 0).all()
    assert ((freq - want).abs() <= 5 * sigma + 1e-9).all(), (freq[want > 0], want[want > 0])


@pytest.mark.parametrize("seeded", [False, True])
def test_sampled_chain_tokens_come_from_the_q_sent(seq, seeded):
    check_tokens_come_from_the_q_sent(seq, seeded)


def test_later_tokens_carry_their_own_q_and_seeded_chains_repeat(seq):
    params = SamplingParams(temperature=0.9, top_k=20, seed=5)
    a = seq.sampled_chain(4, params, first_position=len(PROMPT_TOKENS) + 1, top_k=TOP_K)
    b = seq.sampled_chain(4, params, first_position=len(PROMPT_TOKENS) + 1, top_k=TOP_K)
    assert a.tokens == b.tokens and a.q.rows() == b.q.rows()
    assert a.q.num_rows == 4 and a.is_chain
    for tok, (idx, probs) in zip(a.tokens, a.q.rows()):
        assert tok in idx and abs(sum(probs) - 1) < 1e-5


def test_greedy_chain_is_the_argmax_chain(seq):
    chain = seq.chain(4).tolist()
    again = seq.chain(4).tolist()
    assert chain == again
    assert chain[0] == int(seq.head.target_ids(seq.root_logits.argmax()))
