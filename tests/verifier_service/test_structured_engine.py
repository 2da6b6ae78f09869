"""Structured outputs through the engine, lossless: a JSON schema, any JSON object, a regex, a
choice and an EBNF grammar, each with every method (proposer chains and trees, the draft model,
the MLP speculator, EAGLE chains and trees, lookahead, a hybrid) in one mixed batch with
unconstrained requests; greedy and seeded output is the same with speculation off, every
complete output complies (jsonschema, the regex, the choices), and drafts the grammar forbids
are pruned. Greedy output equals Hugging Face generate with xgrammar's own transformers logits
processor on the same model and grammar. A grammar that does not compile is InvalidArgument
naming its field, and the engine keeps serving."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re

import jsonschema
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
    request_ids,
)

from protos import common_pb2
from splitspec.errors import InvalidArgument
from splitspec.params import SamplingParams, StoppingCriteria, StructuredKind, StructuredOutput
from splitspec.wire import sampling_to_pb, stopping_to_pb
from verifier_service.servicer import VerifierServicer

PLANS = EVERY_DRAFT_SHAPE
SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 6},
                         "n": {"type": "integer", "minimum": 0, "maximum": 99},
                         "ok": {"type": "boolean"},
                         "tag": {"enum": ["red", "green", "blue"]}},
          "required": ["name", "n", "ok", "tag"]}
REGEX = r"[a-z]{2,6}-[0-9]{1,2}"
CHOICES = ("def main", "class Foo", "return None")
GRAMMAR = 'root ::= "(" item "," item ")"\nitem ::= [a-z] [a-z]? [a-z]?'
GRAMMAR_REGEX = r"\([a-z]{1,3},[a-z]{1,3}\)"  # the grammar's language, for the check
STRUCTURES = {
    "json_schema": StructuredOutput(StructuredKind.JSON_SCHEMA, json.dumps(SCHEMA)),
    "json_object": StructuredOutput(StructuredKind.JSON_OBJECT),
    "regex": StructuredOutput(StructuredKind.REGEX, REGEX),
    "choice": StructuredOutput(StructuredKind.CHOICE, choices=CHOICES),
    "grammar": StructuredOutput(StructuredKind.GRAMMAR, GRAMMAR),
}
MAX_TOKENS = 48


def _engine(setup, **kw):
    target, proposers, head = setup
    return make_engine(target, proposers, eagle=head, max_num_seqs=32, **kw)


@pytest.fixture(scope="module")
def setup(learned_models, learned_eagle_head):
    torch.set_num_threads(1)
    return learned_models[0], learned_drafters(learned_models), learned_eagle_head


def _requests(engine, sampling: SamplingParams, tag: str, plans=PLANS, **stop):
    out = []
    for i, (method, k, branches) in enumerate(plans):
        inp = request(engine, f"{tag}-{method}-{k}-{branches}-{i}", PROMPTS[i % len(PROMPTS)],
                      max_tokens=MAX_TOKENS, method=method, k=k, sampling=sampling, **stop)
        if branches > 1:
            inp = dataclasses.replace(inp, speculation=dataclasses.replace(
                inp.speculation, num_branches=branches))
        out.append(inp)
    return out


def _run(engine, inputs):
    """Each request's (tokens, text, last output), or the exception it ended with."""
    async def run():
        engine.start()
        try:
            return await asyncio.gather(*(collect(engine, i) for i in inputs),
                                        return_exceptions=True)
        finally:
            await engine.shutdown()

    return asyncio.run(run())


def _off(inputs):
    return [dataclasses.replace(inp, request_id=inp.request_id + "-off",
                                speculation=dataclasses.replace(inp.speculation, method=None,
                                                                k=0))
            for inp in inputs]


def complies(name: str, text: str) -> bool:
    """Whether a complete output is in its structure's language. JSON strings may hold raw
    control characters other than CR and LF (xgrammar's JSON grammar, as vLLM serves it):
    json.loads reads them with strict=False."""
    if name == "json_schema":
        try:
            jsonschema.validate(json.loads(text, strict=False), SCHEMA)
        except (ValueError, jsonschema.ValidationError):
            return False
        return True
    if name == "json_object":
        try:
            return isinstance(json.loads(text, strict=False), dict)
        except ValueError:
            return False
    if name == "choice":
        return text in CHOICES
    return re.fullmatch(REGEX if name == "regex" else GRAMMAR_REGEX, text) is not None


def check_speculation_changes_nothing(setup, kind: str, plans=PLANS, names=tuple(STRUCTURES)
                                      ) -> dict:
    base = dict(temperature=0.0) if kind == "greedy" else dict(temperature=0.9, seed=7)
    engine = _engine(setup)
    samplings = {name: SamplingParams(**base, structured=STRUCTURES[name]) for name in names}
    samplings["free"] = SamplingParams(**base)  # unconstrained requests in the same batch
    inputs = [inp for name, s in samplings.items() for inp in _requests(engine, s, name, plans)]
    got = _run(engine, inputs)
    off = _run(_engine(setup), _off(inputs))
    failed = [(inp.request_id, g) for inp, g in zip(inputs, got) if isinstance(g, Exception)]
    assert not failed, failed
    assert drained(engine) and engine.executor.sampling.num_processing == 0
    mismatched = [inp.request_id for inp, g, o in zip(inputs, got, off)
                  if isinstance(o, Exception) or g[0] != o[0]]
    assert not mismatched, mismatched
    by_name = {name: got[i * len(plans):(i + 1) * len(plans)]
               for i, name in enumerate(samplings)}
    for name, outs in by_name.items():
        if name == "free":
            continue
        for tokens, text, last in outs:
            # complete: the structure's text, then EOS (the only token the grammar allowed)
            if last.finish_reason == "stop":
                assert complies(name, text), (name, text)
                assert tokens[-1] == 0, (name, tokens)
            else:
                assert last.finish_reason == "length" and len(tokens) == MAX_TOKENS
    return {"engine": engine, "by_name": by_name}


@pytest.mark.parametrize("kind", ["greedy", "seeded"])
def test_every_structure_and_method_equals_speculation_off_in_one_batch(setup, kind):
    out = check_speculation_changes_nothing(setup, kind)
    engine, by_name = out["engine"], out["by_name"]
    # the bounded structures finish (their EOS is the grammar's)
    for name in ("json_schema", "regex", "choice", "grammar"):
        reasons = [last.finish_reason for _, _, last in by_name[name]]
        assert reasons.count("stop") == len(PLANS), (name, reasons)
    # speculation did work for them: drafts accepted, forbidden ones pruned
    structured = [last.usage for name, outs in by_name.items() if name != "free"
                  for _, _, last in outs]
    assert sum(u.accepted_tokens for u in structured) > 0
    assert engine.stats.grammar_pruned_tokens > 0
    stats = {m: engine.stats.method(m) for m in ("ngram", "suffix", "draft", "mlp", "eagle",
                                                  "lookahead")}
    assert all(s.proposed_tokens > 0 for s in stats.values()), stats
    # and the free requests were not held to anything
    assert not all(complies("json_object", text) for _, text, _ in by_name["free"])


def test_the_check_catches_a_matcher_advanced_by_rejected_drafts(setup, monkeypatch):
    bug.grammar_matcher_advanced_by_rejected_drafts(monkeypatch)
    with pytest.raises(AssertionError):
        check_speculation_changes_nothing(setup, "greedy", plans=PLANS[:4],
                                          names=("json_schema", "grammar"))


def test_the_check_catches_a_mask_one_row_late(setup, monkeypatch):
    bug.grammar_mask_one_row_late(monkeypatch)
    with pytest.raises(AssertionError):
        check_speculation_changes_nothing(setup, "greedy", plans=PLANS[:4],
                                          names=("json_schema", "grammar"))


# -- ends, and bad input ------------------------------------------------------------------------

def test_a_structure_that_cannot_finish_ends_with_length_and_a_complete_one_with_stop(setup):
    engine = _engine(setup)
    endless = SamplingParams(temperature=0.0, structured=StructuredOutput(StructuredKind.REGEX,
                                                                         "a{200}"))
    choice = SamplingParams(temperature=0.0, structured=STRUCTURES["choice"])
    inputs = [request(engine, "endless", PROMPTS[0], max_tokens=10, method="ngram", k=4,
                      sampling=endless),
              # EOS is not a stop token here: the complete structure ends it all the same
              request(engine, "choice", PROMPTS[1], max_tokens=MAX_TOKENS, method="ngram", k=4,
                      sampling=choice, ignore_eos=True)]
    (tokens, text, last), (_, choice_text, choice_last) = _run(engine, inputs)
    assert last.finish_reason == "length" and len(tokens) == 10 and set(text) == {"a"}
    assert choice_last.finish_reason == "stop" and choice_text in CHOICES
    assert drained(engine)


def test_nothing_is_output_after_the_token_that_completes_the_structure(setup):
    """A drafted EOS that completes the structure, accepted: the bonus row after it allows only
    EOS, and with ignore_eos that second EOS must not reach the output."""
    engine = _engine(setup)
    words = engine.tokenizer.encode("class Foo", add_special_tokens=False)
    prompt = (words + [0]) * 3 + words[:1]  # n-gram drafts the rest, then EOS
    only = SamplingParams(temperature=0.0, structured=StructuredOutput(
        StructuredKind.CHOICE, choices=("class Foo",)))
    (out,) = _run(engine, [request_ids("one", prompt, max_tokens=20, k=6, method="ngram",
                                       sampling=only, ignore_eos=True)])
    tokens, text, last = out
    assert (text, last.finish_reason, tokens.count(0)) == ("class Foo", "stop", 1)
    assert tokens[-1] == 0 and last.usage.accepted_tokens > 0


def test_a_grammar_that_does_not_compile_is_refused_and_the_engine_keeps_serving(setup):
    engine = _engine(setup)
    bad = {"structured_outputs.regex": StructuredOutput(StructuredKind.REGEX, "[a-"),
           "response_format.json_schema": StructuredOutput(StructuredKind.JSON_SCHEMA,
                                                           '{"type": "nope"}'),
           "structured_outputs.grammar": StructuredOutput(StructuredKind.GRAMMAR, "root ::=")}
    good = SamplingParams(temperature=0.0, structured=STRUCTURES["regex"])

    async def run():
        engine.start()
        try:
            fields = []
            for name, structured in bad.items():
                inp = request(engine, name, PROMPTS[0], method="ngram", k=4,
                              sampling=SamplingParams(temperature=0.0, structured=structured))
                with pytest.raises(InvalidArgument) as err:
                    await collect(engine, inp)
                fields.append(err.value.field)
                with pytest.raises(InvalidArgument):  # blocking too (a direct caller)
                    engine.add_request(inp)
            served = await collect(engine, request(engine, "good", PROMPTS[1], method="ngram",
                                                   k=4, sampling=good, max_tokens=MAX_TOKENS))
            return fields, served
        finally:
            await engine.shutdown()

    fields, (_, text, last) = asyncio.run(run())
    assert fields == list(bad)
    assert last.finish_reason == "stop" and complies("regex", text)
    assert drained(engine) and engine.num_in_flight == 0


def test_the_servicer_takes_a_structured_request_off_the_wire(setup):
    engine = _engine(setup)
    servicer = VerifierServicer(engine, "target", "", "cpu", "float32")
    prompt = engine.tokenizer.encode(PROMPTS[0], add_special_tokens=False)

    async def generate(structured: StructuredOutput):
        msg = common_pb2.GenerateRequest(
            token_ids=common_pb2.TokenIds(ids=prompt),
            sampling=sampling_to_pb(SamplingParams(temperature=0.0, structured=structured)),
            stopping=stopping_to_pb(StoppingCriteria(max_tokens=MAX_TOKENS)),
            speculation=common_pb2.SpeculationConfig(mode=common_pb2.SPECULATION_MODE_ON,
                                                     method="ngram", num_speculative_tokens=4))
        return [out async for out in servicer.Generate(msg, None)]

    async def run():
        engine.start()
        try:
            with pytest.raises(InvalidArgument) as err:
                await generate(StructuredOutput(StructuredKind.REGEX, "(unclosed"))
            return err.value.field, await generate(STRUCTURES["choice"])
        finally:
            await engine.shutdown()

    field, outs = asyncio.run(run())
    assert field == "structured_outputs.regex"
    assert "".join(o.text for o in outs) in CHOICES
    assert outs[-1].finish_reason == common_pb2.FINISH_REASON_STOP


# -- against Hugging Face generate with xgrammar's logits processor ----------------------------

def check_greedy_equals_hugging_face(setup) -> None:
    import xgrammar as xgr
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(setup[0], local_files_only=True,
                                                 dtype=torch.float32)
    engine = _engine(setup)
    names = ("json_schema", "regex", "grammar")
    inputs = [request(engine, f"hf-{name}-{i}-{m}", p, max_tokens=MAX_TOKENS, method=m, k=4,
                      sampling=SamplingParams(temperature=0.0, structured=STRUCTURES[name]))
              for name in names for i, p in enumerate(PROMPTS[:2]) for m in (None, "ngram")]
    got = _run(engine, inputs)
    for inp, out in zip(inputs, got):
        assert not isinstance(out, Exception), out
        compiled = engine.grammars.compile_now(inp.sampling.structured)
        ids = torch.tensor([list(inp.prompt_token_ids)])
        hf = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False,
                            logits_processor=[xgr.contrib.hf.LogitsProcessor(compiled)],
                            pad_token_id=0, eos_token_id=0)
        assert out[0] == hf[0, ids.shape[1]:].tolist(), inp.request_id


def test_greedy_structured_output_equals_hugging_face_with_xgrammar(setup):
    check_greedy_equals_hugging_face(setup)


def test_the_oracle_catches_a_mask_one_row_late(setup, monkeypatch):
    bug.grammar_mask_one_row_late(monkeypatch)
    with pytest.raises(AssertionError):
        check_greedy_equals_hugging_face(setup)
