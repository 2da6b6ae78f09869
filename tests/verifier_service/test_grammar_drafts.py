"""The grammar as a drafter (verifier_service/methods/grammar.py): it drafts the tokens a
structured request's grammar forces next, leaves the matcher as it found it, drops a last token
a longer one could extend, and through the engine (registered for the test, alone and first in a
hybrid) its drafts are accepted while greedy and seeded output stay those of speculation off; a
request without a structure drafts nothing with it."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest
import torch
from engine_testlib import PROMPTS, collect, drained, make_engine, request
from tiny_proposer_models import TINY_TARGET

from splitspec.methods import METHODS, Capabilities, Kind, MethodSpec
from splitspec.params import SamplingParams, StructuredKind, StructuredOutput
from verifier_service.grammar.compiler import GrammarCompiler
from verifier_service.grammar.matcher import GrammarState
from verifier_service.methods.grammar import extendable_ids

V, EOS = 1024, 0
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "tag": {"enum": ["red", "green", "blue"]}},
          "required": ["name", "tag"]}
STRUCTURES = {
    "json_schema": StructuredOutput(StructuredKind.JSON_SCHEMA, json.dumps(SCHEMA)),
    "choice": StructuredOutput(StructuredKind.CHOICE, choices=("def main():", "class Foo:")),
    "grammar": StructuredOutput(StructuredKind.GRAMMAR,
                                'root ::= "result = (" [a-z] [a-z]? ", " [0-9] ")"'),
}


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TINY_TARGET)


def test_extendable_ids_are_the_tokens_a_longer_one_starts_with():
    vocab = [b"a", b"ab", b"b", b"a", b"", b"abc", b"c"]
    assert extendable_ids(vocab) == {0, 1, 3, 4}


def test_forced_tokens_are_the_grammars_own_and_leave_the_matcher_as_found(tokenizer):
    compiler = GrammarCompiler(tokenizer, V, {EOS})
    try:
        state = GrammarState(compiler.compile_now(STRUCTURES["json_schema"]), V)
        encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
        forced = state.forced_tokens(encode, frozenset(), 16)
        assert tokenizer.decode(forced) == '{"name":"'
        # a last token a longer one could extend is left out
        assert state.forced_tokens(encode, frozenset(forced[-1:]), 16) == forced[:-1]
        assert state.forced_tokens(encode, frozenset(), 2) == forced[:2]
        assert state.accept(forced) and state.accept(encode("ab"))  # the matcher did not move
        assert state.forced_tokens(encode, frozenset(), 16) == []  # free text: nothing forced
        assert state.accept(encode('"'))
        assert tokenizer.decode(state.forced_tokens(encode, frozenset(), 16)) == ',"tag":"'
    finally:
        compiler.shutdown()


@pytest.fixture
def grammar_method(monkeypatch):
    """The method in the registry for one test (what its registry line will do)."""
    monkeypatch.setitem(METHODS, "grammar", MethodSpec(
        "grammar", "the tokens the grammar forces", "verifier_service.methods.grammar:"
        "GrammarMethod", Capabilities(), kind=Kind.IN_TARGET))


def _run(engine, inputs):
    async def run():
        engine.start()
        try:
            return await asyncio.gather(*(collect(engine, i) for i in inputs))
        finally:
            await engine.shutdown()

    return asyncio.run(run())


@pytest.mark.parametrize("kind", ["greedy", "seeded"])
def test_forced_drafts_are_accepted_and_change_nothing(grammar_method, target_model_dir, kind):
    torch.set_num_threads(1)
    base = dict(temperature=0.0) if kind == "greedy" else dict(temperature=0.9, seed=5)
    engine = make_engine(target_model_dir, max_num_seqs=16)
    inputs = [request(engine, f"{name}-{method}", PROMPTS[i % len(PROMPTS)], max_tokens=40,
                      method=method, k=6,
                      sampling=SamplingParams(**base, structured=structured))
              for i, (name, structured) in enumerate(STRUCTURES.items())
              for method in ("grammar", "hybrid:grammar+ngram")]
    inputs.append(request(engine, "free", PROMPTS[0], max_tokens=16, method="grammar", k=6,
                          sampling=SamplingParams(**base)))
    got = _run(engine, inputs)
    off = _run(make_engine(target_model_dir), [
        dataclasses.replace(inp, request_id=inp.request_id + "-off",
                            speculation=dataclasses.replace(inp.speculation, method=None, k=0))
        for inp in inputs])
    assert [g[0] for g in got] == [o[0] for o in off]
    assert all(last.finish_reason == "stop" for _, _, last in got[:-1])
    assert drained(engine)
    forced = engine.drafts.in_target.methods["grammar"]
    usage = {inp.request_id: last.usage for inp, (_, _, last) in zip(inputs, got)}
    assert forced.forced_tokens > 0
    assert sum(u.accepted_tokens for rid, u in usage.items() if rid.endswith("-grammar")) > 0
    assert usage["free"].proposed_tokens == 0  # no structure: nothing forced
