"""The draft-model proposer split over two ranks (proposer_service/draft/tp.py: rank 0 here, rank
1 in a process of its own, gloo): over several steps of deltas it drafts what the whole draft
drafts (greedy and seeded sampled: the same tokens; q up to float rounding), unseeded sampled
steps keep the ranks in step (no hang), a rank holds at most 0.55x of the whole draft's weight
bytes. (Drafting what the whole draft drafts, it costs a verifier nothing but time.)"""

from __future__ import annotations

import pytest
import torch

from proposer_service.config import ProposerConfig
from proposer_service.draft.proposer import DraftModelProposer
from proposer_service.draft.tp import start
from splitspec.params import SamplingParams
from splitspec.proposal import SequenceStep
from splitspec.tensor_parallel import weight_bytes

GREEDY = SamplingParams(temperature=0.0)
SEEDED = SamplingParams(temperature=0.8, top_p=0.95, seed=11)


@pytest.fixture(scope="module")
def split(noisy_draft_dir):
    proposer = start(ProposerConfig(method="draft", model=noisy_draft_dir, threads=1,
                                    tensor_parallel_size=2, draft_top_k=16))
    yield proposer
    proposer.stop()


@pytest.fixture(scope="module")
def whole(noisy_draft_dir):
    return DraftModelProposer.load(noisy_draft_dir, torch.device("cpu"), torch.float32,
                                   draft_top_k=16, drafts_ahead=False)


def _steps(proposer, sampling, rounds: int = 4):
    """Drafts of two sequences over `rounds` steps, each step accepting half the last draft
    plus a bonus token (deltas, so the cache is rolled back and extended)."""
    g = torch.Generator().manual_seed(2)
    histories = [torch.randint(3, 1024, (n,), generator=g).tolist() for n in (9, 14)]
    session = proposer.open_session()
    out, steps = [], [SequenceStep(f"s{i}", h, len(h), 4, full_history=True, sampling=sampling)
                      for i, h in enumerate(histories)]
    try:
        for _ in range(rounds):
            drafts = session.propose(steps)
            out.append(drafts)
            steps = []
            for i, d in enumerate(drafts):
                new = d.tokens[:2] + [7]
                histories[i] += new
                steps.append(SequenceStep(f"s{i}", new, len(histories[i]), 4,
                                          sampling=sampling))
        session.release(["s0"])
    finally:
        session.close()
    return out


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_the_split_draft_drafts_what_the_whole_draft_drafts(split, whole, sampling):
    for got, want in zip(_steps(split, sampling), _steps(whole, sampling)):
        for a, b in zip(got, want):
            assert a.tokens == b.tokens
            if b.q is not None:
                torch.testing.assert_close(a.q.probs, b.q.probs, atol=1e-4, rtol=1e-4)


def test_unseeded_sampling_keeps_the_ranks_in_step(split):
    drafts = _steps(split, SamplingParams(temperature=1.0), rounds=3)
    assert all(len(d.tokens) == 4 and d.q is not None for step in drafts for d in step)
    assert all(p.is_alive() for p in split.ranks.procs.values())


def test_a_rank_holds_about_half_the_weights(split, whole):
    assert weight_bytes(split.inner.lean) <= 0.55 * weight_bytes(whole.lean)
    assert not split.describe().drafts_ahead

