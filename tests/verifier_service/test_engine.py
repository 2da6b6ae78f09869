"""Engine behaviour with in-process proposers: losslessness, seeding, robustness, accounting,
stops inside accepted drafts, and characters split over tokens streamed whole."""

from __future__ import annotations

import asyncio
import random

import pytest
from engine_testlib import PROMPTS, collect, make_engine, request, request_ids, run_all, stream

from kernels.sparse_probs import SparseProbs
from proposer_service.base import Proposer, ProposerSession
from proposer_service.ngram import NgramProposer
from splitspec.errors import InvalidArgument, ResourceExhausted
from splitspec.params import SamplingParams
from splitspec.proposal import Draft, ProposerDescription
from splitspec.tensor_parallel import RankLost


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
        if k == 0:  # speculation off: never drafted for
            assert last.usage.method is None and last.usage.proposed_tokens == 0
        else:  # every one of these prompts' outputs repeats itself: prompt lookup finds drafts
            assert last.usage.method == "ngram" and last.usage.num_speculative_tokens == k
            assert last.usage.proposed_tokens > 0, (p, k)
            assert last.usage.accepted_tokens <= last.usage.proposed_tokens


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
                                 SparseProbs.from_rows([([3], [1.0])] * s.k)))  # q(d) = 0
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


def test_an_engine_that_cannot_step_fails_what_it_holds_and_refuses_new_requests_with_why(
        target_model_dir):
    """A lost tensor-parallel rank: the requests in flight fail with its reason, and so does a
    request arriving after (a gateway's retry before the server stops), not admitted to wait
    for a step that never comes."""
    engine = make_engine(target_model_dir)

    async def scenario():
        engine.start()
        gen = engine.generate(request(engine, "held", PROMPTS[0], max_tokens=400))
        await gen.__anext__()
        assert engine.fail_all(RankLost("verifier: tensor-parallel rank 1 exited")) == 1
        with pytest.raises(RankLost, match="rank 1 exited"):
            async for _ in gen:
                pass
        for attempt in range(2):
            with pytest.raises(RankLost, match="rank 1 exited"):
                engine.add_request(request(engine, f"retry{attempt}", PROMPTS[1]))
        assert engine.num_in_flight == 0
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
    assert (last2.finish_reason == "stop"
            and tokens2 == full_tokens[:full_tokens.index(full_tokens[4]) + 1])


# -- a target that follows a script: stops inside accepted drafts, characters split over steps --

@pytest.fixture(scope="module")
def shipped_tokenizer(target_model_dir):
    from splitspec.modelio import load_tokenizer

    return load_tokenizer(target_model_dir)


def scripted_engine(target_model_dir, tmp_path_factory, script: list[int]):
    from scripted_model import make_scripted_target

    model = make_scripted_target(target_model_dir, tmp_path_factory.mktemp("scripted"), script)
    return make_engine(str(model), num_kv_blocks=64)


def test_eos_or_a_stop_token_inside_an_accepted_draft_ends_the_output_exactly_there(
        target_model_dir, tmp_path_factory, shipped_tokenizer):
    """The target's greedy output is "x = 1\n<|endoftext|>return y" in a loop; the prompt holds
    one loop, so from the second step on the n-gram proposer drafts exactly what the target
    emits: the EOS (or the stop token) arrives inside an accepted draft, with accepted drafts
    after it that must not be emitted. Speculation on and off give the same output."""
    tok = shipped_tokenizer
    eos = tok.eos_token_id
    script = (tok.encode("x = 1\n", add_special_tokens=False) + [eos]
              + tok.encode("return y", add_special_tokens=False))
    i_eos = script.index(eos)
    stop_tok = script[i_eos + 2]  # a plain token two after the EOS
    prompt = script + script[:2]  # the output starts at script[2]
    engine = scripted_engine(target_model_dir, tmp_path_factory, script)
    cases = [  # (stopping, expected output tokens)
        (dict(), script[2:i_eos + 1]),
        (dict(stop_token_ids=(stop_tok,), ignore_eos=True), script[2:i_eos + 3]),
        (dict(ignore_eos=True, max_tokens=12), (script[2:] + script)[:12]),
    ]

    def inputs(k, rid):
        return [request_ids(f"{rid}-{j}", prompt, **{"max_tokens": 16, **stopping}, k=k)
                for j, (stopping, _) in enumerate(cases)]

    async def scenario():
        engine.start()
        try:
            return {k: [await stream(engine, inp) for inp in inputs(k, f"k{k}")] for k in (0, 6)}
        finally:
            await engine.shutdown()

    runs = asyncio.run(scenario())
    for j, (stopping, expected) in enumerate(cases):
        off, on = runs[0][j], runs[6][j]
        tokens = [t for out in on for t in out.token_ids]
        text = "".join(out.text for out in on)
        assert tokens == expected, stopping
        assert [t for out in off for t in out.token_ids] == tokens
        assert "".join(out.text for out in off) == text
        stopped = [t for t in expected if t not in (eos, stop_tok)] if j < 2 else expected
        assert text == tok.decode(stopped, skip_special_tokens=True)
        assert on[-1].finish_reason == off[-1].finish_reason == ("stop" if j < 2 else "length")
        usage = on[-1].usage
        # The stop came inside a multi-token step of accepted drafts.
        assert usage.accepted_tokens > 0 and usage.steps < len(tokens), usage
        assert all(len(out.token_ids) <= 1 for out in off)


def test_characters_split_over_tokens_and_steps_stream_whole(target_model_dir, tmp_path_factory,
                                                            shipped_tokenizer):
    """"é日🐍" is nine byte-level tokens: most tokens end inside a character. Streamed pieces
    never carry a replacement character, and they add up to the decoded output, whether the
    characters' bytes arrive one step at a time or several per step (speculation on)."""
    tok = shipped_tokenizer
    script = tok.encode("é日🐍\n", add_special_tokens=False)
    prompt = script + script[:2]
    engine = scripted_engine(target_model_dir, tmp_path_factory, script)

    async def scenario():
        engine.start()
        try:
            return [await stream(engine, request_ids(f"u{k}", prompt, max_tokens=40, k=k))
                    for k in (0, 5)]
        finally:
            await engine.shutdown()

    off, on = asyncio.run(scenario())
    tokens = [t for out in off for t in out.token_ids]
    assert tokens == (script[2:] + script * 5)[:40]
    for outs in (off, on):
        assert all("\ufffd" not in out.text for out in outs)
        assert "".join(out.text for out in outs) == tok.decode(tokens)
    assert [t for out in on for t in out.token_ids] == tokens
    assert on[-1].usage.accepted_tokens > 0
    # The partial-character branch ran: one-token steps whose token ends inside a character
    # stream no text yet.
    assert sum(1 for out in off if out.token_ids and not out.text) >= 10


def test_a_seeded_verifier_draws_unseeded_requests_alike_after_a_restart(target_model_dir):
    """--seed (vLLM's): two verifiers started with the same seed give the same unseeded draws
    for the same requests in the same order; another seed, others."""
    def draws(seed: int):
        engine = make_engine(target_model_dir, seed=seed)
        res = asyncio.run(run_all(engine, [request(engine, f"r{i}", p, max_tokens=12,
                                                   sampling=SamplingParams(temperature=1.0))
                                           for i, p in enumerate(PROMPTS[:2])]))
        return [r[0] for r in res]

    first = draws(3)
    assert draws(3) == first and draws(4) != first
