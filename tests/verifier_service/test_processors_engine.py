"""Logits processors through the engine, lossless: with presence, frequency and repetition
penalties, logit bias, min_tokens, bad words and allowed token ids (each alone and all together),
greedy and seeded output is the same with speculation off and with every method (proposer
chains and trees, the draft model, the MLP speculator, EAGLE chains and trees, lookahead,
hybrids), all in one mixed batch; and on a prefix-cache hit. Greedy output with the penalties
and bias equals Hugging Face generate with RepetitionPenaltyLogitsProcessor and OpenAI's formulas
(written here) on the same model."""

from __future__ import annotations

import asyncio
import dataclasses

import planted_bugs as bug
import pytest
import torch
from engine_testlib import (
    EVERY_DRAFT_SHAPE,
    PROMPTS,
    collect,
    drained,
    learned_drafters,
    make_engine,
    request,
    run_all,
)

from splitspec.params import SamplingParams

PLANS = EVERY_DRAFT_SHAPE
BIAS = ((5, 3.0), (17, -100.0), (42, 8.0))
FIELDS = {
    "penalties": dict(presence_penalty=0.8, frequency_penalty=0.9),
    "repetition": dict(repetition_penalty=1.6),
    "bias": dict(logit_bias=BIAS),
    "min_tokens": dict(min_tokens=20),
    "bad_words": dict(bad_words=("return", "(")),
    "allowed": dict(allowed_token_ids=tuple(range(0, 1024, 3))),
    "all": dict(presence_penalty=0.5, frequency_penalty=-0.3, repetition_penalty=1.2,
                logit_bias=BIAS, min_tokens=6, bad_words=("print",),
                allowed_token_ids=tuple(range(0, 1024, 2))),
}
MAX_TOKENS = 20


def _engine(setup, **kw):
    target, proposers, head = setup
    return make_engine(target, proposers, eagle=head, max_num_seqs=32, **kw)


@pytest.fixture(scope="module")
def setup(learned_models, learned_eagle_head):
    torch.set_num_threads(1)
    return learned_models[0], learned_drafters(learned_models), learned_eagle_head


def _requests(engine, sampling: SamplingParams, tag: str = ""):
    out = []
    for i, (method, k, branches) in enumerate(PLANS):
        inp = request(engine, f"{tag}{method}-{k}-{branches}-{i}", PROMPTS[i % len(PROMPTS)],
                      max_tokens=MAX_TOKENS, method=method, k=k, sampling=sampling)
        if branches > 1:
            inp = dataclasses.replace(inp, speculation=dataclasses.replace(
                inp.speculation, num_branches=branches))
        out.append(inp)
    return out


def _outputs(engine, inputs):
    return [tokens for tokens, _, _ in asyncio.run(run_all(engine, inputs))]


@pytest.mark.parametrize("kind", ["greedy", "seeded"])
def test_every_field_and_method_equals_speculation_off_in_one_batch(setup, kind):
    base = dict(temperature=0.0) if kind == "greedy" else dict(temperature=0.9, seed=11)
    engine = _engine(setup)
    plain = _outputs(_engine(setup), _requests(engine, SamplingParams(**base)))
    # the bad words: what the first requests would write first without them
    words = tuple(engine.tokenizer.decode([out[0]]) for out in plain[:3])
    fields = {**FIELDS, "bad_words": dict(bad_words=words)}
    samplings = {name: SamplingParams(**base, **f) for name, f in fields.items()}
    # one engine, one mixed batch: every field with every method at once
    inputs = [inp for name, s in samplings.items()
              for inp in _requests(engine, s, name)]
    got = _outputs(engine, inputs)
    assert drained(engine) and engine.executor.sampling.num_processing == 0
    # the off reference: each field's requests with speculation off
    off_engine = _engine(setup)
    off = _outputs(off_engine, [dataclasses.replace(inp, request_id=inp.request_id + "-off",
                                                    speculation=dataclasses.replace(
                                                        inp.speculation, method=None, k=0))
                                for inp in inputs])
    mismatched = [(inp.request_id, name) for inp, g, o, name in
                  zip(inputs, got, off, [n for n in samplings for _ in PLANS]) if g != o]
    assert not mismatched, mismatched
    stats = {m: engine.stats.method(m) for m in ("ngram", "suffix", "draft", "mlp", "eagle",
                                                  "lookahead")}
    assert all(s.proposed_tokens > 0 for s in stats.values()), stats
    assert sum(s.accepted_tokens for s in stats.values()) > 0
    # the processors did something: without them the outputs differ
    n = len(PLANS)
    for name in ("penalties", "repetition", "bias", "bad_words", "allowed"):
        at = list(samplings).index(name) * n
        assert got[at:at + n] != plain, name
    at = list(samplings).index("bad_words") * n
    banned = {plain[i][0] for i in range(3)}
    assert not banned & {t for out in got[at:at + n] for t in out}
    # min_tokens: no request ended before it
    at = list(samplings).index("min_tokens") * n
    assert all(len(g) >= 20 for g in got[at:at + n])


def test_a_prefix_cache_hit_keeps_the_processed_output(setup):
    sampling = SamplingParams(temperature=0.0, **FIELDS["all"])
    engine = _engine(setup)
    long = PROMPTS[0] * 6

    async def cold_then_hit():
        engine.start()
        try:
            cold = await collect(engine, request(engine, "cold", long, max_tokens=MAX_TOKENS,
                                                 method="ngram", k=4, sampling=sampling))
            hit = await collect(engine, request(engine, "hit", long, max_tokens=MAX_TOKENS,
                                                method="suffix", k=4, sampling=sampling))
            return cold, hit
        finally:
            await engine.shutdown()

    cold, hit = asyncio.run(cold_then_hit())
    assert hit[2].usage.cached_tokens > 0
    assert hit[0] == cold[0]
    off = _outputs(_engine(setup), [request(engine, "off", long, max_tokens=MAX_TOKENS,
                                            sampling=sampling)])
    assert off == [cold[0]]


# -- against Hugging Face generate and OpenAI's formulas ------------------------------------------

class OpenAIPenalties:
    """OpenAI's formula, as its docs write it: mu[j] -> mu[j] - c[j] * alpha_frequency
    - float(c[j] > 0) * alpha_presence, c over the generated tokens; then the logit bias."""

    def __init__(self, prompt_len, presence, frequency, bias):
        self.prompt_len, self.presence, self.frequency, self.bias = (prompt_len, presence,
                                                                      frequency, dict(bias))

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        for row, ids in enumerate(input_ids.tolist()):
            generated = ids[self.prompt_len:]
            for j in set(generated):
                c = generated.count(j)
                scores[row, j] -= c * self.frequency + self.presence
            for j, b in self.bias.items():
                scores[row, j] += b
        return scores


def check_greedy_equals_hugging_face(setup) -> None:
    from transformers import (
        AutoModelForCausalLM,
        LogitsProcessorList,
        RepetitionPenaltyLogitsProcessor,
    )

    target = setup[0]
    model = AutoModelForCausalLM.from_pretrained(target, local_files_only=True,
                                                 dtype=torch.float32)
    fields = dict(presence_penalty=0.4, frequency_penalty=0.7, repetition_penalty=1.3,
                  logit_bias=BIAS)
    sampling = SamplingParams(temperature=0.0, **fields)
    engine = _engine(setup)
    prompts = PROMPTS[:3]
    inputs = [request(engine, f"hf{i}-{m}", p, max_tokens=16, method=m, k=4,
                      sampling=sampling, ignore_eos=True)
              for i, p in enumerate(prompts) for m in (None, "ngram")]
    got = _outputs(engine, inputs)
    for i in range(len(prompts)):
        ids = torch.tensor([list(inputs[2 * i].prompt_token_ids)])
        procs = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.3),
                                     OpenAIPenalties(ids.shape[1], 0.4, 0.7, BIAS)])
        out = model.generate(ids, max_new_tokens=16, min_new_tokens=16, do_sample=False,
                             logits_processor=procs, pad_token_id=0)
        want = out[0, ids.shape[1]:].tolist()
        assert got[2 * i] == want, i
        assert got[2 * i + 1] == want, i


def test_greedy_with_penalties_and_bias_equals_hugging_face(setup):
    check_greedy_equals_hugging_face(setup)


def test_the_oracle_catches_a_bias_left_off_the_target(setup, monkeypatch):
    bug.logit_bias_left_off_the_target(monkeypatch)
    with pytest.raises(AssertionError):
        check_greedy_equals_hugging_face(setup)
