"""A peer's test data (bench/data/jsonschemabench: 50 schemas of JSONSchemaBench's Glaiveai2K
and GitHub easy and medium sets, with their test cases): each schema compiled as a structured
request's is (verifier_service/grammar/compiler.py: compact JSON, the served tokenizer), each
test case's instance written compact and tokenized, and xgrammar's GrammarMatcher over its
tokens accepts the valid instances (complete: the stop token allowed after them) and refuses
the invalid ones, as the dataset says. A schema that is refused before it compiles (an
unsupported keyword) or does not compile is skipped with its reason counted.

Where the grammar and the dataset disagree, the case is listed in KNOWN with what was measured
(xgrammar as installed, on the shipped target's tokenizer): the list is held exactly, so a new
disagreement fails, and one that goes away (a fixed grammar) asks for the list to shrink."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from splitspec.errors import InvalidArgument
from splitspec.params import StructuredKind, StructuredOutput
from verifier_service.grammar.compiler import GrammarCompiler
from verifier_service.grammar.matcher import GrammarState

DATA = Path(__file__).resolve().parents[2] / "bench" / "data" / "jsonschemabench" / \
    "schemas.jsonl"
# (schema, test index) -> why the grammar and the dataset disagree there, as measured
STRICT = ("valid, refused: compiled strict (xgrammar's default, vLLM's too), an array without "
          "`items` takes no items; accepted when compiled with strict_mode=False")
BYTES = "valid, refused by xgrammar's matcher at the byte level too (accept_string)"
FORMAT = "invalid (2024-02-30), accepted: format date is checked by its pattern, not the calendar"
KNOWN = {
    ("book_flight_d310c236.json", 1): FORMAT,
    ("book_flight_f6de227e.json", 1): FORMAT,
    ("book_flight_f6de227e.json", 2): "invalid, accepted: its fault is a format the grammar "
                                      "checks by pattern only",
    ("o10011.json", 0): BYTES + " (oneOf beside properties and additionalProperties false)",
    ("o10011.json", 1): BYTES + " (oneOf beside properties and additionalProperties false)",
    ("o10030.json", 0): BYTES + " (its items schema names `host` and `port` outside "
                                "`properties`: a malformed schema read differently)",
    ("o10030.json", 3): "invalid, accepted: the same malformed items schema",
    ("o1008.json", 0): BYTES + " (a draft-04 schema with `id`)",
    ("o1008.json", 2): BYTES + " (a draft-04 schema with `id`)",
    ("o10094.json", 0): BYTES,
    ("o26966.json", 0): STRICT,
    ("o26966.json", 2): STRICT,
}


def cases() -> list[dict]:
    return [json.loads(line) for line in DATA.read_text().splitlines()]


@pytest.fixture(scope="module")
def compiled(target_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target_model_dir)
    vocab = json.loads((Path(target_model_dir) / "config.json").read_text())["vocab_size"]
    eos = tokenizer.eos_token_id
    compiler = GrammarCompiler(tokenizer, vocab, {eos}, timeout_s=60)
    out, skipped = {}, collections.Counter()
    try:
        for case in cases():
            s = StructuredOutput(StructuredKind.JSON_SCHEMA, json.dumps(case["schema"]))
            try:
                out[case["name"]] = compiler.compile_now(s.validate())
            except InvalidArgument as exc:
                skipped[_reason(exc.message)] += 1
        yield tokenizer, vocab, eos, out, skipped
    finally:
        compiler.shutdown()


def _reason(message: str) -> str:
    if "which structured outputs do not support" in message:
        return "unsupported keyword: " + message.split("uses ", 1)[1].split(" at ")[0]
    return "does not compile: " + message.split("does not compile: ", 1)[-1][:60]


def accepts(state: GrammarState, tokens: list[int], eos: int) -> bool:
    return state.accept(tokens) and state.accept([eos])


def test_the_subset_is_the_documented_one():
    rows = cases()
    assert len(rows) == 50
    assert collections.Counter(r["set"] for r in rows) == {"Glaiveai2K": 17, "Github_easy": 17,
                                                           "Github_medium": 16}
    assert all({t["valid"] for t in r["tests"]} == {True, False} for r in rows)


def test_valid_instances_are_accepted_and_invalid_ones_refused(compiled):
    tokenizer, vocab, eos, grammars, skipped = compiled
    results = collections.Counter()
    disagree = []
    for case in cases():
        grammar = grammars.get(case["name"])
        if grammar is None:
            continue
        for test in case["tests"]:
            text = json.dumps(test["data"], ensure_ascii=False, separators=(",", ":"))
            tokens = tokenizer.encode(text, add_special_tokens=False)
            got = accepts(GrammarState(grammar, vocab), tokens, eos)
            results[(test["valid"], got)] += 1
            if got != test["valid"]:
                disagree.append((case["name"], case["tests"].index(test)))
    print(f"\nJSONSchemaBench subset: {len(grammars)} schemas compiled, skipped: "
          f"{dict(skipped)}; (valid, accepted) counts: {dict(results)}")
    assert len(grammars) + sum(skipped.values()) == 50
    assert results[(True, True)] > 0 and results[(False, False)] > 0
    assert set(disagree) == set(KNOWN), sorted(set(disagree) ^ set(KNOWN))
    # most of it holds: the grammar decides as the dataset says on at least 90 % of instances
    assert len(disagree) <= 0.1 * sum(results.values())
