"""The grammar as a drafter (verifier_service/methods/grammar.py): it drafts the tokens a
structured request's grammar forces next, leaves the matcher as it found it, drops a last token
a longer one could extend, and through the engine (registered for the test, alone and first in a
hybrid, with proposers or beside an EAGLE head) its drafts are accepted while greedy and seeded
output stay those of speculation off; a request without a structure drafts nothing with it."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import planted_bugs as bug
import pytest
import torch
from engine_testlib import PROMPTS, collect, drained, make_engine, request
from tiny_proposer_models import TINY_TARGET

from proposer_service.ngram import NgramProposer
from proposer_service.suffix import SuffixProposer
from splitspec.errors import ServiceError
from splitspec.methods import METHODS, Kind, is_method, structured_only
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
        spell = lambda text: (encode(text), None)  # noqa: E731
        forced, held, whole = state.forced_tokens(spell, 16)
        assert tokenizer.decode(forced) == '{"name":"' and held is None and whole
        # a last token held back comes back beside the drafted ones
        hold = lambda text: (encode(text)[:-1], encode(text)[-1])  # noqa: E731
        assert state.forced_tokens(hold, 16) == (forced[:-1], forced[-1], True)
        assert state.forced_tokens(spell, 2) == (forced[:2], None, False)
        assert state.accept(forced) and state.accept(encode("ab"))  # the matcher did not move
        assert state.forced_tokens(spell, 16) == ([], None, False)  # free text: nothing forced
        assert state.accept(encode('"'))
        assert tokenizer.decode(state.forced_tokens(spell, 16)[0]) == ',"tag":"'
    finally:
        compiler.shutdown()


def _run(engine, inputs):
    async def run():
        engine.start()
        try:
            return await asyncio.gather(*(collect(engine, i) for i in inputs))
        finally:
            await engine.shutdown()

    return asyncio.run(run())


FORCED_METHODS = ("grammar", "hybrid:grammar+ngram", "hybrid:grammar+suffix")


def _engine(model_dir):
    return make_engine(model_dir, max_num_seqs=16,
                       proposers={"ngram": NgramProposer(), "suffix": SuffixProposer()})


def test_the_grammar_drafter_is_registered_for_structured_requests_only():
    spec = METHODS["grammar"]
    assert spec.kind is Kind.IN_TARGET and spec.capabilities.structured_only
    assert structured_only("grammar") and structured_only("hybrid:grammar+ngram")
    assert not structured_only("ngram") and not structured_only("hybrid:suffix+eagle")
    assert is_method("hybrid:grammar+ngram") and is_method("hybrid:grammar+suffix")
    # beside an EAGLE head (a state of each per sequence); an in-target drafter gates nothing
    assert is_method("hybrid:grammar+eagle") and not is_method("hybrid:grammar|ngram")


@pytest.mark.parametrize("kind", ["greedy", "seeded"])
def test_forced_drafts_are_accepted_and_change_nothing(target_model_dir, kind):
    torch.set_num_threads(1)
    base = dict(temperature=0.0) if kind == "greedy" else dict(temperature=0.9, seed=5)
    engine = _engine(target_model_dir)
    inputs = [request(engine, f"{name}-{method}", PROMPTS[i % len(PROMPTS)], max_tokens=40,
                      method=method, k=6,
                      sampling=SamplingParams(**base, structured=structured))
              for i, (name, structured) in enumerate(STRUCTURES.items())
              for method in FORCED_METHODS]
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
    assert forced.forced_tokens > 0 and 0 < forced.forced_accepted <= forced.forced_tokens
    assert forced.stats() == {"forced_tokens_total": forced.forced_tokens,
                              "forced_tokens_accepted_total": forced.forced_accepted}
    assert sum(u.accepted_tokens for rid, u in usage.items() if rid.endswith("-grammar")) > 0
    assert usage["free"].proposed_tokens == 0  # no structure: nothing forced
    # what /metrics reports: requests by kind, each grammar compiled once, then found cached
    snap = engine.snapshot()
    n = len(FORCED_METHODS)
    assert snap.structured_requests == {"json_schema": n, "choice": n, "grammar": n}
    assert (snap.grammar_compiles, snap.grammar_cache_hits) == (3, 3 * (n - 1))
    assert snap.grammar_compile_seconds > 0


def check_forced_drafts_end_at_a_token_boundary(model_dir, monkeypatch) -> int:
    """Greedy structured requests drafted by the grammar (alone and first in hybrids) equal
    speculation off, and every forced draft is the forced text's own: its bytes a prefix of the
    text the grammar forces, and where it spells all of it, its last token one no longer token
    starts with (found by brute force over the vocabulary), so the model's next token cannot
    cross the forced text's end, unless the target had been seen writing that token alone at a
    forced text's end more often than going on past it. Returns the drafts checked."""
    import verifier_service.methods.grammar as grammar_drafter

    seen = []
    real = grammar_drafter._ForcedDrafts.propose

    def recorded(self, tokens, k):
        text = self.grammar.jump_forward() if self.grammar is not None else ""
        out = real(self, tokens, k)
        # the evidence on its last token so far (the step that verifies it adds to it later)
        ends = self.method.spellings.ends(out[-1]) if out else (0, 0)
        seen.append((text, list(out), ends))
        return out

    monkeypatch.setattr(grammar_drafter._ForcedDrafts, "propose", recorded)
    engine = _engine(model_dir)
    inputs = [request(engine, f"{name}-{method}-{i}", PROMPTS[i], max_tokens=40, method=method,
                      k=8, sampling=SamplingParams(temperature=0.0, structured=structured))
              for name, structured in STRUCTURES.items() for method in FORCED_METHODS
              for i in range(2)]
    got = _run(engine, inputs)
    off = _run(make_engine(model_dir), [
        dataclasses.replace(inp, request_id=inp.request_id + "-off",
                            speculation=dataclasses.replace(inp.speculation, method=None, k=0))
        for inp in inputs])
    assert [g[0] for g in got] == [o[0] for o in off]
    vocab = engine.drafts.in_target.methods["grammar"]
    import xgrammar as xgr

    table = xgr.TokenizerInfo.from_huggingface(vocab._served()[0],
                                               vocab_size=vocab.vocab_size).decoded_vocab
    drafts = [(text.encode(), d, ends) for text, d, ends in seen if d]
    for text, draft, ends in drafts:
        spelled = b"".join(table[t] for t in draft)
        assert text.startswith(spelled), (text, spelled)
        alone, merged = ends
        if spelled == text and alone <= merged:
            last = table[draft[-1]]
            longer = [t for t, b in enumerate(table) if len(b) > len(last) and b.startswith(last)]
            assert not longer, (text, last, [table[t] for t in longer[:3]])
    return len(drafts)


def test_forced_drafts_end_at_a_token_boundary(target_model_dir, monkeypatch):
    torch.set_num_threads(1)
    assert check_forced_drafts_end_at_a_token_boundary(target_model_dir, monkeypatch) > 0


def test_the_check_catches_a_forced_draft_that_crosses_the_token_boundary(target_model_dir,
                                                                           monkeypatch):
    torch.set_num_threads(1)
    bug.forced_draft_crosses_the_token_boundary(monkeypatch)
    with pytest.raises(AssertionError):
        check_forced_drafts_end_at_a_token_boundary(target_model_dir, monkeypatch)


@pytest.fixture(scope="module")
def eagle_head(target_model_dir, tmp_path_factory):
    from eagle_testlib import head_for_target

    return str(head_for_target(tmp_path_factory.mktemp("grammar-eagle"), target_model_dir, 3))


def check_forced_drafts_beside_an_eagle_head(model_dir, head, kind) -> None:
    """hybrid:grammar+eagle: each sequence has the grammar's state and the head's; their drafts
    merge into one tree, both are proposed and accepted, and output stays speculation off's."""
    base = dict(temperature=0.0) if kind == "greedy" else dict(temperature=0.9, seed=5)
    engine = make_engine(model_dir, proposers={}, eagle=head, max_num_seqs=16)
    method = "hybrid:grammar+eagle"
    inputs = [request(engine, f"{name}-{i}", PROMPTS[i % len(PROMPTS)], max_tokens=24,
                      method=method, k=6, sampling=SamplingParams(**base, structured=s))
              for i, (name, s) in enumerate(STRUCTURES.items())]
    inputs.append(request(engine, "free", PROMPTS[0], max_tokens=12, method=method, k=6,
                          sampling=SamplingParams(**base)))
    got = _run(engine, inputs)
    off = _run(make_engine(model_dir, proposers={}), [
        dataclasses.replace(inp, request_id=inp.request_id + "-off",
                            speculation=dataclasses.replace(inp.speculation, method=None, k=0))
        for inp in inputs])
    assert [g[0] for g in got] == [o[0] for o in off]
    assert drained(engine) and engine.drafts.in_target.num_states == 0
    forced = engine.drafts.in_target.methods["grammar"]
    assert 0 < forced.forced_accepted <= forced.forced_tokens
    assert engine.drafts.in_target.methods["eagle"].counters["eager_chains_total"] > 0
    usage = {inp.request_id: last.usage for inp, (_, _, last) in zip(inputs, got)}
    assert usage["free"].proposed_tokens > 0  # no structure: the head drafts alone


@pytest.mark.parametrize("kind", ["greedy", "seeded"])
def test_forced_drafts_beside_an_eagle_head_change_nothing(target_model_dir, eagle_head, kind):
    torch.set_num_threads(1)
    check_forced_drafts_beside_an_eagle_head(target_model_dir, eagle_head, kind)


def test_the_check_catches_a_matcher_advanced_by_the_heads_rejected_drafts(
        target_model_dir, eagle_head, monkeypatch):
    torch.set_num_threads(1)
    bug.grammar_matcher_advanced_by_rejected_drafts(monkeypatch)
    # the outputs differ, or the grammar refuses what a later step emits and fails the request
    with pytest.raises((AssertionError, ServiceError)):
        check_forced_drafts_beside_an_eagle_head(target_model_dir, eagle_head, "greedy")
