"""A request's structured output (splitspec/params.py StructuredOutput): validated naming its
public field (OpenAI's response_format, vLLM's structured_outputs), carried in SamplingParams
and across the wire unchanged, a logits processor of its own, and never sent to proposers."""

from __future__ import annotations

import pytest

from protos import common_pb2 as pb
from splitspec.errors import InvalidArgument
from splitspec.params import SamplingParams, StructuredKind, StructuredOutput
from splitspec.proposal import SequenceStep, step_from_pb, step_to_pb
from splitspec.wire import sampling_from_pb, sampling_to_pb


def _structured(kind: str, spec: str = "", choices=()) -> StructuredOutput:
    return StructuredOutput(StructuredKind(kind), spec, tuple(choices))


EVERY_KIND = [_structured("json_object"), _structured("json_schema", '{"type": "string"}'),
              _structured("regex", "[a-z]+"), _structured("choice", choices=("yes", "no")),
              _structured("grammar", 'root ::= "a"')]


@pytest.mark.parametrize("structured", EVERY_KIND, ids=lambda s: s.kind.value)
def test_every_kind_crosses_the_wire_unchanged(structured):
    params = SamplingParams(temperature=0.0, structured=structured).validate()
    assert params.has_processors
    assert sampling_from_pb(sampling_to_pb(params)) == params


def test_a_message_without_a_kind_is_refused():
    msg = pb.SamplingParams()
    msg.structured.SetInParent()
    with pytest.raises(InvalidArgument) as err:
        sampling_from_pb(msg)
    assert err.value.field == "structured_outputs"


def test_proposers_are_not_sent_the_grammar():
    params = SamplingParams(temperature=0.5, structured=EVERY_KIND[1])
    step = step_from_pb(step_to_pb(SequenceStep("s", [1, 2], 2, 4, sampling=params)))
    assert step.sampling.structured is None and step.sampling.temperature == 0.5


@pytest.mark.parametrize("structured, field", [
    (_structured("json_schema", "{not json"), "response_format.json_schema"),
    (_structured("json_schema", "[1]"), "response_format.json_schema"),
    (_structured("regex", "x" * (64 * 1024 + 1)), "structured_outputs.regex"),
    (_structured("regex", ""), "structured_outputs.regex"),
    (_structured("choice"), "structured_outputs.choice"),
    (_structured("choice", choices=("a", "")), "structured_outputs.choice"),
    (_structured("choice", choices=("a",) * 40_000), "structured_outputs.choice"),
    (_structured("grammar", " "), "structured_outputs.grammar"),
    (_structured("json_object", "{}"), "response_format"),
])
def test_structured_outputs_are_validated_naming_their_field(structured, field):
    with pytest.raises(InvalidArgument) as err:
        SamplingParams(structured=structured).validate()
    assert err.value.field == field
