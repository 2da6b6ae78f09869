"""The draft proposer's prefix reuse (proposer_service/draft/prefix.py): a sequence whose
prompt starts like a finished (or running) one's starts from a copy of that one's draft cache,
prefills only the rest, and drafts what it drafts from scratch, greedy and sampled."""

from __future__ import annotations

import planted_bugs as bug
import pytest
import torch
from test_draft_proposer import reference_greedy

from proposer_service.draft.proposer import DraftModelProposer
from splitspec.params import SamplingParams
from splitspec.proposal import SequenceStep

CPU = torch.device("cpu")
K = 4
LONG = [(7 * i + 3) % 90 + 5 for i in range(48)]


@pytest.fixture(scope="module")
def proposer(noisy_draft_dir):
    torch.set_num_threads(1)
    return DraftModelProposer.load(noisy_draft_dir, CPU, torch.float32, draft_top_k=16)


def _first(session, sid, prompt, sampling):
    (d,) = session.propose([SequenceStep(sid, list(prompt), len(prompt), K, full_history=True,
                                         sampling=sampling)])
    return d


def check_reuse(proposer) -> None:
    proposer.prefixes.max_bytes = 64 << 20
    session = proposer.open_session()
    _first(session, "a", LONG, SamplingParams(temperature=0.0))
    session.release(["a"])  # finished: its draft cache is kept
    hits = proposer.prefixes.hits
    # a second turn (all of A and more), and a shared system prompt with another question
    for sid, prompt in (("b", LONG + [11, 12, 13]), ("c", LONG[:30] + [40, 41, 42, 43])):
        d = _first(session, sid, prompt, SamplingParams(temperature=0.0))
        assert d.tokens == reference_greedy(proposer.model, prompt, K), sid
        assert session.cached_tokens(sid)[:len(prompt) - 1] == prompt[:-1]
    assert proposer.prefixes.hits - hits >= len(LONG) - 1 + 30
    # sampled: the same q and tokens as a proposer that reuses nothing
    sampled = SamplingParams(temperature=0.8, seed=5)
    cold = DraftModelProposer(proposer.model, CPU, proposer.vocab_size, proposer.fingerprint,
                              draft_top_k=16, prefix_cache_mb=0)
    warm_d = _first(session, "d", LONG + [7, 8], sampled)
    cold_d = _first(cold.open_session(), "d", LONG + [7, 8], sampled)
    assert warm_d.tokens == cold_d.tokens
    torch.testing.assert_close(warm_d.q.probs, cold_d.q.probs)


def test_a_prompt_starting_like_a_finished_one_reuses_its_draft_cache(proposer):
    check_reuse(proposer)


def test_the_check_fails_when_the_reused_cache_is_one_column_off(monkeypatch, proposer):
    bug.draft_prefix_one_column_off(monkeypatch)
    with pytest.raises(AssertionError):
        check_reuse(proposer)
