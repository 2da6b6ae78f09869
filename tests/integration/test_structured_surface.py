"""Structured outputs through the real processes (gateway, verifier, proposers) and the official
`openai` client: `chat.completions.parse` with a pydantic model, response_format and vLLM's
structured_outputs on chat and completions, streamed and n > 1, the public gRPC API; complete
outputs comply; a structure that cannot finish ends with "length"; a schema or grammar that does
not compile is a 400 naming the field the request used while the stack keeps serving; the
policy runs the grammar drafter for structured requests and never for others; the verifier's
/metrics count them. docs/api.md's examples are these requests."""

from __future__ import annotations

import json
import re
from typing import Literal

import grpc
import httpx
import jsonschema
import pytest
from pydantic import BaseModel, Field

from protos import common_pb2, generation_pb2_grpc
from splitspec.methods import components_of
from splitspec.params import StructuredKind, StructuredOutput
from splitspec.wire import structured_to_pb

pytestmark = pytest.mark.integration

openai = pytest.importorskip("openai")

COLOR_SCHEMA = {"type": "object",
                "properties": {"name": {"enum": ["red", "green", "blue"]},
                               "shade": {"type": "integer", "minimum": 0, "maximum": 9}},
                "required": ["name", "shade"], "additionalProperties": False}


class Color(BaseModel):
    name: Literal["red", "green", "blue"]
    shade: int = Field(ge=0, le=9)


@pytest.fixture(scope="module")
def oa(stack):
    return openai.OpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0,
                         timeout=120)


@pytest.fixture(scope="module")
def model(oa):
    return oa.models.list().data[0].id


@pytest.fixture(scope="module")
def client(stack):
    with httpx.Client(base_url=stack.url, timeout=120) as c:
        yield c


def test_the_openai_clients_parse_returns_the_pydantic_model(oa, model):
    parse = getattr(oa.chat.completions, "parse", None) or oa.beta.chat.completions.parse
    out = parse(model=model, messages=[{"role": "user", "content": "Pick a color."}],
                response_format=Color, max_tokens=64, temperature=0)
    choice = out.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Color)
    assert Color.model_validate_json(choice.message.content) == choice.message.parsed


def test_response_format_json_schema_streamed_with_n_choices(oa, model):
    fmt = {"type": "json_schema", "json_schema": {"name": "color", "schema": COLOR_SCHEMA,
                                                  "strict": True}}
    chunks = list(oa.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "A color, as JSON."}],
        response_format=fmt, n=2, seed=3, temperature=0.8, max_tokens=64, stream=True))
    texts, reasons = ["", ""], [None, None]
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
            reasons[ch.index] = ch.finish_reason or reasons[ch.index]
    assert reasons == ["stop", "stop"]
    for text in texts:
        jsonschema.validate(json.loads(text), COLOR_SCHEMA)


def test_json_object_regex_choice_and_grammar_on_completions(client):
    cases = [({"response_format": {"type": "json_object"}},
              lambda t: isinstance(json.loads(t), dict)),
             ({"structured_outputs": {"regex": "[a-z]{2,5}-[0-9]{2}"}},
              lambda t: re.fullmatch("[a-z]{2,5}-[0-9]{2}", t)),
             ({"structured_outputs": {"choice": ["yes", "no", "maybe"]}},
              lambda t: t in ("yes", "no", "maybe")),
             ({"structured_outputs": {"grammar": 'root ::= "(" [a-z]+ ")"'}},
              lambda t: re.fullmatch(r"\([a-z]+\)", t)),
             ({"structured_outputs": {"json": COLOR_SCHEMA}},
              lambda t: jsonschema.validate(json.loads(t), COLOR_SCHEMA) is None)]
    for fields, complies in cases:
        r = client.post("/v1/completions", json={"prompt": "Answer:", "max_tokens": 48,
                                                 "temperature": 0, **fields})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        if choice["finish_reason"] == "stop":
            assert complies(choice["text"]), (fields, choice["text"])
        else:  # json_object may run on (any object): what it wrote so far
            assert choice["finish_reason"] == "length" and "json_object" in str(fields)


def test_a_structure_that_cannot_finish_ends_with_length_and_what_was_written(client):
    r = client.post("/v1/completions", json={
        "prompt": "x", "max_tokens": 8, "temperature": 0,
        "structured_outputs": {"regex": "a{100}"}})
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length" and choice["text"] == "a" * len(choice["text"])
    assert r.json()["usage"]["completion_tokens"] == 8 and choice["text"]


@pytest.mark.parametrize("fields, field", [
    ({"structured_outputs": {"json": {"type": "object", "minProperties": 2,
                                      "additionalProperties": False}}},
     "structured_outputs.json"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {
        "type": "object", "minProperties": 2, "additionalProperties": False}}}},
     "response_format.json_schema"),
    ({"structured_outputs": {"grammar": 'root ::= "a" | '}}, "structured_outputs.grammar"),
    ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"json": {"if": {"type": "string"}}}}, "structured_outputs.json"),
])
def test_a_structure_that_does_not_compile_is_a_400_and_the_stack_keeps_serving(client, fields,
                                                                              field):
    for stream in (False, True):
        r = client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "stream": stream,
            **fields})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == field, r.json()
    ok = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert ok.status_code == 200


def test_the_policy_runs_the_grammar_for_structured_requests_only(client):
    structured = client.post("/v1/completions", json={
        "prompt": "Answer:", "max_tokens": 32, "temperature": 0,
        "structured_outputs": {"json": COLOR_SCHEMA}}).json()["usage"]["speculation"]
    assert structured["mode"] == "auto"
    for _ in range(3):
        free = client.post("/v1/completions", json={
            "prompt": "alpha beta gamma " * 4, "max_tokens": 8,
            "temperature": 0}).json()["usage"]["speculation"]
        assert "grammar" not in components_of(free["method"]), free


def test_grpc_generate_holds_the_output_to_its_structure(stack):
    structured = structured_to_pb(StructuredOutput(StructuredKind.CHOICE,
                                                   choices=("left", "right")))
    with grpc.insecure_channel(f"127.0.0.1:{stack.config.grpc_port}") as ch:
        stub = generation_pb2_grpc.GenerationStub(ch)
        msgs = list(stub.Generate(common_pb2.GenerateRequest(
            text="Which way?", sampling=common_pb2.SamplingParams(temperature=0,
                                                                  structured=structured),
            stopping=common_pb2.StoppingCriteria(max_tokens=16),
            speculation=common_pb2.SpeculationConfig(
                mode=common_pb2.SPECULATION_MODE_ON, method="grammar",
                num_speculative_tokens=4)), timeout=120))
        assert "".join(m.text for m in msgs) in ("left", "right")
        assert msgs[-1].finish_reason == common_pb2.FINISH_REASON_STOP
        with pytest.raises(grpc.RpcError) as e:
            list(stub.Generate(common_pb2.GenerateRequest(
                text="x", sampling=common_pb2.SamplingParams(
                    structured=common_pb2.StructuredOutput(grammar='root ::= "a" | '))),
                timeout=120))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details().startswith("structured_outputs.grammar")


def test_the_verifier_counts_structured_requests(stack, client):
    client.post("/v1/completions", json={"prompt": "x", "max_tokens": 4, "temperature": 0,
                                         "structured_outputs": {"choice": ["a", "b"]}})
    text = httpx.get(stack.metrics_urls["verifier"], timeout=30).text
    kinds = re.findall(r'splitspec_structured_output_requests_total\{kind="(\w+)"\} (\S+)', text)
    assert dict(kinds).get("choice") and float(dict(kinds)["choice"]) >= 1
    assert "splitspec_structured_output_grammar_compiles_total" in text
