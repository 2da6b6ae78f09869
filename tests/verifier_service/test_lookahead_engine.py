"""Lookahead decoding in the engine (the registry's in-target `lookahead`): greedy output equals
speculation off alone, batched with proposer-backed and plain sequences and under preemption;
seeded sampled output is identical on and off; its states are freed and no block leaks; and on a
repetitive prompt it accepts tokens. Each request may shape it (W, N, G) itself, also while
prompts are prefilled in chunks; the verifier refuses a window its node limit cannot hold and
reports the method's counters."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from engine_testlib import PROMPTS, collect, drained, make_engine, request, run_all

from splitspec.errors import InvalidArgument
from splitspec.params import LookaheadParams, SamplingParams

REPETITIVE = "def f(x):\n    return x\n\ndef g(x):\n    return x\n\ndef h(x):\n    return x\n\n"


def _baseline(engine_dir, prompts, max_tokens, sampling=None):
    engine = make_engine(engine_dir, proposers={})
    res = asyncio.run(run_all(engine, [request(engine, f"b{i}", p, max_tokens=max_tokens, k=0,
                                               sampling=sampling)
                                       for i, p in enumerate(prompts)]))
    return [r[0] for r in res]


def test_lookahead_alone_and_batched_equals_speculation_off(target_model_dir):
    prompts = [REPETITIVE, *PROMPTS[:3]]
    off = _baseline(target_model_dir, prompts, 40)
    engine = make_engine(target_model_dir, max_num_seqs=8)  # n-gram proposer beside it
    plans = [("lookahead", 8), ("lookahead", 6), ("ngram", 4), (None, 0)]
    res = asyncio.run(run_all(engine, [request(engine, f"r{i}", p, max_tokens=40, method=m, k=k)
                                       for i, (p, (m, k)) in enumerate(zip(prompts, plans))]))
    for want, (tokens, _, _) in zip(off, res):
        assert tokens == want
    usage = res[0][2].usage
    assert usage.method == "lookahead" and usage.proposed_tokens > 0
    assert usage.accepted_tokens > 0  # the repetitive prompt's n-grams are found
    assert engine.drafts.in_target.num_states == 0 and drained(engine)


def test_lookahead_under_preemption_equals_speculation_off(target_model_dir):
    off = _baseline(target_model_dir, PROMPTS[:4], 40)

    async def run():
        engine = make_engine(target_model_dir, proposers={}, max_num_seqs=8, block_size=4,
                             num_kv_blocks=40)
        engine.start()
        try:
            res = await asyncio.gather(*(collect(engine, request(
                engine, f"t{i}", p, max_tokens=40, method="lookahead", k=8))
                for i, p in enumerate(PROMPTS[:4])))
            return [r[0] for r in res], engine
        finally:
            await engine.shutdown()

    got, engine = asyncio.run(run())
    assert engine.scheduler.num_preemptions > 0 and got == off
    assert engine.drafts.in_target.num_states == 0 and drained(engine)


def test_seeded_output_is_identical_with_lookahead_on_and_off(target_model_dir):
    sampling = SamplingParams(temperature=0.8, seed=77)
    (off,) = _baseline(target_model_dir, [REPETITIVE], 32, sampling)
    engine = make_engine(target_model_dir, proposers={})
    ((on, _, _),) = asyncio.run(run_all(engine, [request(
        engine, "s", REPETITIVE, max_tokens=32, method="lookahead", k=8, sampling=sampling)]))
    assert on == off and drained(engine)


def test_each_request_shapes_its_own_lookahead_also_under_chunked_prefill(target_model_dir):
    prompts = [REPETITIVE, *PROMPTS[:3]]
    off = _baseline(target_model_dir, prompts, 40)
    # 16 batched tokens a step: every prompt is prefilled in several chunks
    engine = make_engine(target_model_dir, proposers={}, max_num_seqs=8,
                         max_num_batched_tokens=16)
    shapes = [LookaheadParams(2, 4, 3), LookaheadParams(window=1), None,
              LookaheadParams(4, 2, 0)]
    inputs = []
    for i, (p, shape) in enumerate(zip(prompts, shapes)):
        inp = request(engine, f"c{i}", p, max_tokens=40, method="lookahead", k=8)
        inputs.append(dataclasses.replace(
            inp, speculation=dataclasses.replace(inp.speculation, lookahead=shape)))
    res = asyncio.run(run_all(engine, inputs))
    assert [r[0] for r in res] == off
    assert sum(len(i.prompt_token_ids) > 16 for i in inputs) >= 2  # prefilled in chunks
    stats = engine.snapshot().in_target["lookahead"]
    assert stats["window_nodes_total"] > 0 and stats["candidate_nodes_total"] > 0
    assert stats["accepted_from_pool_total"] + stats["accepted_from_window_total"] > 0
    assert stats["sequences"] == 0 and stats["pool_ngrams"] == 0  # freed with the sequences
    assert engine.drafts.in_target.num_states == 0 and drained(engine)


def test_a_window_beyond_the_verifier_s_node_limit_is_refused_naming_the_field(target_model_dir):
    engine = make_engine(target_model_dir, proposers={}, max_num_speculative_tokens=8)
    inp = request(engine, "w", PROMPTS[0], method="lookahead", k=8)
    too_wide = dataclasses.replace(inp.speculation, lookahead=LookaheadParams(5, 3))  # 10 nodes
    with pytest.raises(InvalidArgument) as e:
        engine.add_request(dataclasses.replace(inp, speculation=too_wide))
    assert e.value.field == "speculation.lookahead.window"
    assert drained(engine)
