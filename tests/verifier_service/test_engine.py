"""Engine behaviour with in-process proposers: losslessness, seeding, robustness, accounting."""

from __future__ import annotations

import asyncio
import random

import pytest

from engine_testlib import PROMPTS, collect, make_engine, request, run_all
from proposer_service.base import Proposer, ProposerSession
from proposer_service.ngram import NgramProposer
from splitspec.errors import InvalidArgument, ResourceExhausted
from splitspec.params import SamplingParams
from splitspec.proposal import Draft, ProposerDescription, SparseDistribution


@pytest.fixture(scope="module")
def baseline(target_model_dir):
    """Greedy output of every prompt alone, speculation off."""
    out = {}
    for i, p in enumerate(PROMPTS):
        engine = make_engine(target_model_dir)
        (res,) = asyncio.run(run_all(engine, [request(engine, f"b{i}", p, k=0)]))
        out[p] = res[0]
    return out


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_with_ngram_equals_greedy_without(target_model_dir, baseline, k):
    engine = make_engine(target_model_dir)
    results = asyncio.run(run_all(engine, [request(engine, f"r{i}", p, k=k)
                                           for i, p in enumerate(PROMPTS)]))
    for p, (tokens, _, last) in zip(PROMPTS, results):
        assert tokens == baseline[p], p
        assert last.usage.method == "ngram" and last.usage.num_speculative_tokens == k
    assert sum(r[2].usage.accepted_tokens for r in results) > 0


def test_mixed_batch_with_different_k_and_off(target_model_dir, baseline):
    engine = make_engine(target_model_dir, max_num_seqs=16)
    ks = [0, 1, 2, 3, 4, 5, 6, 0]
    results = asyncio.run(run_all(engine, [request(engine, f"m{i}", p, k=k)
                                           for i, (p, k) in enumerate(zip(PROMPTS, ks))]))
    for p, k, (tokens, _, last) in zip(PROMPTS, ks, results):
        assert tokens == baseline[p]
        assert (last.usage.proposed_tokens > 0) == (k > 0) or last.usage.proposed_tokens == 0


class GarbageSession(ProposerSession):
    """Answers with every kind of wrong: too many tokens, ids out of vocabulary, negative ids,
    distributions that do not match, random plausible tokens, and unknown sequence ids."""

    def __init__(self, vocab: int):
        self.vocab = vocab
        self.rng = random.Random(0)

    def propose(self, steps):
        out = []
        for s in steps:
            kind = self.rng.randrange(6)
            if kind == 0:
                out.append(Draft(s.seq_id, [1] * (s.k + 3)))
            elif kind == 1:
                out.append(Draft(s.seq_id, [self.vocab + 5] * s.k))
            elif kind == 2:
                out.append(Draft(s.seq_id, [-1] * s.k))
            elif kind == 3:
                out.append(Draft(s.seq_id, [2] * s.k,
                                 [SparseDistribution([3], [1.0])] * s.k))  # q(d) = 0
            elif kind == 4:
                out.append(Draft(s.seq_id, [self.rng.randrange(self.vocab) for _ in range(s.k)]))
            else:
                out.append(Draft("not-a-sequence", [1]))
        return out

    def release(self, seq_ids):
        pass


class GarbageProposer(Proposer):
    def __init__(self, vocab: int):
        self.vocab = vocab

    def describe(self):
        return ProposerDescription(method="ngram")

    def open_session(self):
        return GarbageSession(self.vocab)


def test_garbage_proposals_cannot_change_greedy_output(target_model_dir, baseline):
    probe = make_engine(target_model_dir)
    engine = make_engine(target_model_dir,
                         proposers={"ngram": GarbageProposer(probe.runner.vocab_size)})
    results = asyncio.run(run_all(engine, [request(engine, f"g{i}", p, k=4)
                                           for i, p in enumerate(PROMPTS)]))
    for p, (tokens, _, _) in zip(PROMPTS, results):
        assert tokens == baseline[p]


def test_seeded_sampling_is_reproducible_alone_and_in_a_batch(target_model_dir):
    sampling = SamplingParams(temperature=0.9, top_p=0.95, seed=1234)
    prompt = PROMPTS[0]

    def run(batch_size: int):
        engine = make_engine(target_model_dir, max_num_seqs=8)
        others = [request(engine, f"o{i}", PROMPTS[i + 1], k=i % 3,
                          sampling=SamplingParams(temperature=1.0))
                  for i in range(batch_size - 1)]
        mine = request(engine, "seeded", prompt, k=3, sampling=sampling)
        return asyncio.run(run_all(engine, others + [mine]))[-1][0]

    alone = run(1)
    assert run(4) == alone
    assert run(8) == alone


def test_proposer_restart_resynchronises_without_changing_output(target_model_dir, baseline):
    engine = make_engine(target_model_dir)
    client = engine.proposers["ngram"]
    prompt = PROMPTS[0]

    async def scenario():
        engine.start()
        inp = request(engine, "r", prompt, max_tokens=40, k=3)
        tokens, steps = [], 0
        async for out in engine.generate(inp):
            tokens += out.token_ids
            steps += 1
            if steps == 3:
                client.restart(NgramProposer())  # state gone: a new epoch
            last = out
        await engine.shutdown()
        return tokens, last

    tokens, last = asyncio.run(scenario())
    engine2 = make_engine(target_model_dir)
    (ref,) = asyncio.run(run_all(engine2, [request(engine2, "x", prompt, max_tokens=40)]))
    assert tokens == ref[0]
    assert last.usage.accepted_tokens > 0


def test_abort_and_validation_errors(target_model_dir):
    engine = make_engine(target_model_dir, max_waiting=1, max_num_seqs=1)

    async def scenario():
        engine.start()
        gen = engine.generate(request(engine, "long", PROMPTS[0], max_tokens=400))
        first = await gen.__anext__()
        assert first.finish_reason is None
        # One waiting slot: the second request queues, the third is refused.
        queued = engine.add_request(request(engine, "q1", PROMPTS[1]))
        with pytest.raises(ResourceExhausted):
            engine.add_request(request(engine, "q2", PROMPTS[2]))
        assert engine.abort("long") and engine.abort("q1")
        rest = [o async for o in gen]
        assert rest[-1].finish_reason == "abort"
        last = await queued.outputs.get()
        assert last.finish_reason == "abort"
        with pytest.raises(InvalidArgument, match="max_tokens"):
            engine.add_request(request(engine, "big", PROMPTS[0], max_tokens=10**6))
        with pytest.raises(InvalidArgument, match="prompt"):
            engine.add_request(request(engine, "empty", ""))
        assert engine.num_running == 0 and engine.num_waiting == 0
        # Still serving after all that.
        tokens, _, last = await collect(engine, request(engine, "after", PROMPTS[3], k=2))
        assert last.finish_reason == "length" and len(tokens) == 24
        await engine.shutdown()

    asyncio.run(scenario())


def test_stop_strings_and_stop_tokens(target_model_dir, baseline):
    engine = make_engine(target_model_dir)
    full_tokens = baseline[PROMPTS[2]]
    full_text = engine.tokenizer.decode(full_tokens)
    stop = full_text[5:8]
    results = asyncio.run(run_all(engine, [
        request(engine, "s", PROMPTS[2], k=3, stop=(stop,)),
        request(engine, "t", PROMPTS[2], k=3, stop_token_ids=(full_tokens[4],)),
    ]))
    (_, text, last), (tokens2, _, last2) = results
    assert last.finish_reason == "stop" and text == full_text[:full_text.find(stop)]
    assert last2.finish_reason == "stop" and tokens2 == full_tokens[:full_tokens.index(full_tokens[4]) + 1]
