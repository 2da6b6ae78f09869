"""bench/structured_bench.py's own parts: the schemas it takes (in turn from each set of the
committed subset), its compliance check, and the grammar mask's cost (bench/grammar_mask_cost.py)
measured on matchers inside their structure."""

from __future__ import annotations

import sys

from splitspec.launcher import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))

from grammar_mask_cost import mask_seconds  # noqa: E402
from structured_bench import SETS, complies, schemas  # noqa: E402


def test_schemas_are_taken_in_turn_from_each_set():
    got = schemas(20)
    assert len(got) == 20 and [c["set"] for c in got[:6]] == list(SETS) * 2
    assert len({c["name"] for c in got}) == 20


def test_compliance_is_valid_json_against_the_schema():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert complies('{"a":1}', schema)
    assert not complies('{"a":"x"}', schema) and not complies('{"a":1', schema)


def test_the_mask_cost_is_timed_on_matchers_inside_their_structure():
    import pytest
    from tiny_proposer_models import TINY_TARGET
    from transformers import AutoTokenizer

    from splitspec.params import StructuredKind, StructuredOutput
    from verifier_service.grammar.compiler import GrammarCompiler

    tokenizer = AutoTokenizer.from_pretrained(TINY_TARGET)
    vocab = 1024
    compiler = GrammarCompiler(tokenizer, vocab, {0})
    try:
        grammar = compiler.compile_now(StructuredOutput(StructuredKind.REGEX, "ab+c"))
        output = tokenizer.encode("abbbbbc", add_special_tokens=False)
        fill, apply = mask_seconds([grammar], [output], vocab, batch=3, reps=3, warmup=1)
        assert fill > 0 and apply > 0
        with pytest.raises(ValueError, match="does not follow its grammar"):
            mask_seconds([grammar], [tokenizer.encode("cccc", add_special_tokens=False)],
                         vocab, batch=1, reps=1)
    finally:
        compiler.shutdown()
