"""A sampled EAGLE chain (verifier_service/methods/eagle/head.py, sampled_chain) carries exactly
the q each token was drawn from: the request's sampling parameters applied to the head's own logits,
truncated to its top tokens, indices in the target's vocabulary. Drawn tokens follow that q
(unseeded, and seeded over positions), and a seeded chain is a function of (seed, position).
Chains of several sequences drafted together (sampled_chain_many) are each what the sequence
drafts alone: its own parameters, its own q, its own keyed noise."""

from __future__ import annotations

import pytest
import torch
from eagle_testlib import PROMPT_TOKENS, eagle3_sequence, eagle3_sequences

from kernels.sampling import apply_sampling_params, keyed_exponentials, noise_key
from splitspec.params import SamplingParams
from verifier_service.methods.eagle.head import sampled_chain_many

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


def check_tokens_come_from_the_q_sent(seq, seeded: bool, n: int = 800, beside=None) -> None:
    """Drawn alone, or with `beside` (another sequence, other parameters, a longer chain:
    drafted first) in one batch: row by row, each token follows the q sent with it."""
    params = SamplingParams(temperature=1.5, top_p=0.98, seed=11 if seeded else None)
    want = expected_q(seq, params)
    counts = torch.zeros_like(want)
    torch.manual_seed(0)
    for i in range(n):
        if beside is None:
            draft = seq.sampled_chain(1, params, first_position=100 + i, top_k=TOP_K)
        else:
            draft = sampled_chain_many([seq, beside], [1, 3], [params, OTHER], [100 + i, 40],
                                       TOP_K)[0]
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


OTHER = SamplingParams(temperature=0.6, top_k=5)  # unseeded


@pytest.mark.parametrize("seeded", [False, True])
def test_tokens_drawn_beside_another_sequence_come_from_their_q(seeded):
    seq, other = eagle3_sequences([PROMPT_TOKENS, PROMPT_TOKENS[3:] + [7, 19]])
    check_tokens_come_from_the_q_sent(seq, seeded, n=500, beside=other)


def check_sampled_chains_together_as_alone() -> None:
    """Three sequences with their own parameters and k, drafted together: each gets the chain
    and the q rows it gets alone, and every token is the keyed race at (seed, its position)
    over the q sent with it."""
    prompts = [PROMPT_TOKENS, PROMPT_TOKENS[2:] + [5, 9], PROMPT_TOKENS[:5]]
    together, alone = eagle3_sequences(prompts), eagle3_sequences(prompts)
    params = [SamplingParams(temperature=0.9, top_k=20, seed=5),
              SamplingParams(temperature=1.3, top_p=0.9, seed=7),
              SamplingParams(temperature=0.7, min_p=0.1, seed=3)]
    ks = [2, 4, 1]
    first = [len(p) + 1 for p in prompts]
    got = sampled_chain_many(together, ks, params, first, TOP_K)
    for g, a, k, p, f in zip(got, alone, ks, params, first):
        want = a.sampled_chain(k, p, f, TOP_K)
        assert g.tokens == want.tokens and len(g.tokens) == k
        for (gi, gp), (wi, wp) in zip(g.q.rows(), want.q.rows()):
            assert gi == wi
            torch.testing.assert_close(torch.tensor(gp), torch.tensor(wp))
        for i, (tok, (idx, probs)) in enumerate(zip(g.tokens, g.q.rows())):
            noise = keyed_exponentials([noise_key(p.seed, f + i)], torch.tensor([idx]))
            assert idx[int((torch.tensor([probs]) / noise).argmax())] == tok


def test_sampled_chains_drafted_together_are_each_alone():
    check_sampled_chains_together_as_alone()
