"""Hybrid drafts through the engine (in process): a request of hybrid:ngram+suffix asks both
proposers in the same step, each over its own stream (its own bookkeeping of what it has heard,
`SequenceState.proposer_marks`), and verifies their merged tree. Greedy output equals
speculation off, batched with a plain n-gram request, and every KV block comes back. (Seeded and
sampled hybrids, and the in-target head as a component, run through the services in
tests/integration/test_learned_proposers.py.)"""

from __future__ import annotations

import asyncio

from engine_testlib import PROMPTS, drained, make_engine, request, run_all

from proposer_service.ngram import NgramProposer
from proposer_service.suffix import SuffixProposer

HYBRID = "hybrid:ngram+suffix"


def run(model_dir, method, k):
    engine = make_engine(model_dir, proposers={"ngram": NgramProposer(),
                                               "suffix": SuffixProposer()}, max_num_seqs=8)
    inputs = [request(engine, f"r{i}", p, max_tokens=24, method=method, k=k)
              for i, p in enumerate(PROMPTS[:3])]
    inputs.append(request(engine, "n", PROMPTS[3], max_tokens=24, k=3))
    return engine, asyncio.run(run_all(engine, inputs))


def test_hybrid_drafts_equal_speculation_off(target_model_dir):
    _, off = run(target_model_dir, None, 0)
    engine, on = run(target_model_dir, HYBRID, 6)
    assert [t for t, _, _ in on] == [t for t, _, _ in off]
    assert sum(last.usage.proposed_tokens for _, _, last in on[:3]) > 0
    assert all(last.usage.method == HYBRID for _, _, last in on[:3])
    stats = engine.stats
    assert stats.method("ngram").steps > 0 and stats.method("suffix").steps > 0
    assert stats.method(HYBRID).greedy.drafts > 0  # its acceptance, under its own name
    assert drained(engine)
