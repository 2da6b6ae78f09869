"""Structured outputs at the front doors: OpenAI's response_format and vLLM's structured_outputs
declared once (gateway/request_models.py) on chat and completions, n > 1 and streaming alike,
converted to the one StructuredOutput the verifier compiles; bad input is a 400 naming the
field (a schema over the size limit, an unsupported keyword, two structures at once); the gRPC
door checks SamplingParams.structured the same way and forwards it as it came, and the policy
sees a structured request as one (the grammar drafter is offered to it alone)."""

from __future__ import annotations

import asyncio
import json

import pytest
from test_grpc_api import RecordingPool

from gateway.frontend import Frontend
from gateway.grpc_api import GenerationServicer
from gateway.policy import SpeculationPolicy
from gateway.request_models import parse_chat_request, parse_completion_request
from gateway.rest import public_structured_field
from protos import common_pb2, verifier_pb2
from splitspec.errors import InvalidArgument, ServiceError
from splitspec.params import MAX_STRUCTURED_SPEC_BYTES, StructuredKind, StructuredOutput
from splitspec.wire import structured_to_pb

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
MESSAGES = [{"role": "user", "content": "Give me a name."}]


def chat(**fields):
    return parse_chat_request({"messages": MESSAGES, **fields}).generation


def complete(**fields):
    return parse_completion_request({"prompt": "x", **fields}).generation


@pytest.mark.parametrize("fields, want", [
    ({"response_format": {"type": "text"}}, None),
    ({"response_format": {"type": "json_object"}}, StructuredOutput(StructuredKind.JSON_OBJECT)),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "person", "schema": SCHEMA, "strict": True, "description": "d"}}},
     StructuredOutput(StructuredKind.JSON_SCHEMA, json.dumps(SCHEMA, separators=(",", ":")))),
    ({"structured_outputs": {"json": SCHEMA}},
     StructuredOutput(StructuredKind.JSON_SCHEMA, json.dumps(SCHEMA, separators=(",", ":")))),
    ({"structured_outputs": {"json": json.dumps(SCHEMA)}},
     StructuredOutput(StructuredKind.JSON_SCHEMA, json.dumps(SCHEMA))),
    ({"structured_outputs": {"regex": "[a-z]{3}"}},
     StructuredOutput(StructuredKind.REGEX, "[a-z]{3}")),
    ({"structured_outputs": {"choice": ["yes", "no"]}},
     StructuredOutput(StructuredKind.CHOICE, choices=("yes", "no"))),
    ({"structured_outputs": {"grammar": 'root ::= "a" | "b"'}},
     StructuredOutput(StructuredKind.GRAMMAR, 'root ::= "a" | "b"')),
    ({"structured_outputs": {"json_object": True}}, StructuredOutput(StructuredKind.JSON_OBJECT)),
])
def test_both_endpoints_take_each_structure(fields, want):
    for parse in (chat, complete):
        gen = parse(**fields)
        assert gen.sampling.structured == want
        # n choices and a stream: each choice held to the same structure
        many = parse(**fields, n=3, seed=1, stream=True)
        assert [s.structured for s in many.choice_sampling()] == [want] * 3


@pytest.mark.parametrize("fields, field", [
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_object", "json_schema": {"name": "a", "schema": {}}}},
     "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
     "response_format.json_schema.name"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": 3}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "a", "schema": {"type": "object", "if": {"required": ["a"]}}}}},
     "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "a", "schema": {"properties": {"a": {"$ref": "https://example.com/s.json"}}}}}},
     "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "a", "schema": {"description": "x" * MAX_STRUCTURED_SPEC_BYTES}}}},
     "response_format.json_schema"),
    ({"structured_outputs": {"json": {"then": {}}}}, "structured_outputs.json"),
    ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ({"structured_outputs": {}}, "structured_outputs"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({"structured_outputs": {"choice": ["a", ""]}}, "structured_outputs.choice"),
    ({"structured_outputs": {"grammar": "x" * (MAX_STRUCTURED_SPEC_BYTES + 1)}},
     "structured_outputs.grammar"),
    ({"structured_outputs": {"regex": "a", "disable_any_whitespace": True}},
     "structured_outputs.disable_any_whitespace"),
    ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
     "structured_outputs"),
    ({"guided_json": SCHEMA}, "guided_json"),
    # the declarations' own attribute names are no public fields
    ({"structured_outputs": {"json_": SCHEMA}}, "structured_outputs.json_"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema_": {}}}},
     "response_format.json_schema.schema_"),
])
def test_bad_structures_are_refused_naming_the_field(fields, field):
    for parse in (chat, complete):
        with pytest.raises(InvalidArgument) as e:
            parse(**fields)
        assert e.value.field == field, (fields, e.value)


def test_a_property_named_like_an_unsupported_keyword_is_no_keyword():
    schema = {"type": "object", "properties": {"if": {"type": "string"}, "then": {}}}
    assert chat(structured_outputs={"json": schema}).sampling.structured is not None


def test_a_compile_error_from_the_verifier_names_the_field_the_request_used():
    """The wire carries a schema's kind; its compile error is renamed to the request's field."""
    given = StructuredOutput(StructuredKind.JSON_SCHEMA, "{}",
                             public_field="structured_outputs.json")
    with pytest.raises(ServiceError) as e:  # as the verifier pool raises it
        with public_structured_field(given):
            raise ServiceError("response_format.json_schema: does not compile: x",
                               "response_format.json_schema")
    assert e.value.field == "structured_outputs.json"
    assert e.value.message == "structured_outputs.json: does not compile: x"
    with pytest.raises(InvalidArgument) as e:  # the same field: as it came
        with public_structured_field(StructuredOutput(StructuredKind.JSON_SCHEMA, "{}")):
            raise InvalidArgument("response_format.json_schema", "does not compile: x")
    assert e.value.field == "response_format.json_schema"


class StructuredPool(RecordingPool):
    async def info(self):
        return verifier_pb2.VerifierInfo(
            model="target", max_model_len=512, default_num_speculative_tokens=3,
            max_num_speculative_tokens=8,
            proposers=[verifier_pb2.ProposerStatus(method=m) for m in ("ngram", "grammar")])


def grpc_send(sampling: common_pb2.SamplingParams) -> common_pb2.GenerateRequest:
    pool = StructuredPool()
    servicer = GenerationServicer(Frontend(pool, SpeculationPolicy()))

    async def call():
        return [m async for m in servicer.Generate(
            common_pb2.GenerateRequest(text="x", sampling=sampling), None)]

    asyncio.run(call())
    (sent,) = pool.requests
    return sent


def test_the_grpc_door_forwards_a_structure_and_the_policy_sees_it():
    structured = structured_to_pb(StructuredOutput(StructuredKind.CHOICE, choices=("a", "b")))
    sent = grpc_send(common_pb2.SamplingParams(temperature=0, structured=structured))
    assert sent.sampling.structured == structured
    assert sent.speculation_plan.method == "grammar"  # offered to structured requests, cold
    free = grpc_send(common_pb2.SamplingParams(temperature=0))
    assert free.speculation_plan.method != "grammar"


@pytest.mark.parametrize("structured, field", [
    (common_pb2.StructuredOutput(), "structured_outputs"),
    (common_pb2.StructuredOutput(json_schema='{"if": {}}'), "response_format.json_schema"),
    (common_pb2.StructuredOutput(regex="a" * (MAX_STRUCTURED_SPEC_BYTES + 1)),
     "structured_outputs.regex"),
    (common_pb2.StructuredOutput(choice=common_pb2.StructuredOutput.Choices()),
     "structured_outputs.choice"),
])
def test_the_grpc_door_refuses_a_bad_structure_by_its_field(structured, field):
    with pytest.raises(InvalidArgument) as e:
        grpc_send(common_pb2.SamplingParams(structured=structured))
    assert e.value.field == field
