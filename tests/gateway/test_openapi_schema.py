"""/openapi.json stays true: every route of the app is described with its methods, each request
body's schema (generated from its declaration, gateway/request_models.py) lists exactly the
fields the parser accepts, extensions included, and the limits it states are the ones enforced."""

from __future__ import annotations

import re

import pytest
from starlette.testclient import TestClient

from gateway.request_models import parse_chat_request, parse_completion_request
from gateway.rest import build_app
from splitspec.errors import InvalidArgument
from splitspec.params import (
    MAX_ALLOWED_TOKEN_IDS,
    MAX_BAD_WORD_CHARS,
    MAX_BAD_WORDS,
    MAX_LOGIT_BIAS,
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_PENALTY,
    MAX_PROMPT_LOOKUP_N,
    MAX_REPETITION_PENALTY,
    MIN_REPETITION_PENALTY,
    StructuredKind,
    StructuredOutput,
)


class NoPool:
    replicas: list = []


def document(max_prompts: int = 16):
    app = build_app(frontend=type("F", (), {"tracer": None, "metrics": None, "pool": NoPool})(),
                    max_prompts=max_prompts)
    with TestClient(app) as client:
        return app, client.get("/openapi.json").json()


@pytest.fixture(scope="module")
def doc():
    return document()[1]


def schema(doc, name: str) -> dict:
    return doc["components"]["schemas"][name]


def body_schema(doc, path: str) -> dict:
    ref = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return schema(doc, ref["$ref"].rpartition("/")[2])


def nonnull(prop: dict) -> dict:
    """A nullable property's non-null schema."""
    (only,) = [s for s in prop.get("anyOf", [prop]) if s.get("type") != "null"]
    return only


def test_every_route_of_the_app_is_described():
    app, doc = document()
    for route in app.routes:
        for method in route.methods - {"HEAD"}:
            assert method.lower() in doc["paths"][route.path], (route.path, method)
    assert {"/v1/chat/completions", "/ready", "/openapi.json"} <= set(doc["paths"])
    assert doc["openapi"].startswith("3.1")


COMMON = {"model": "m", "max_tokens": 4, "temperature": 0.5, "top_p": 0.9, "top_k": 3,
          "min_p": 0.1, "seed": 1, "stop": ["\n"], "stop_token_ids": [2], "n": 2,
          "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": False,
          "speculation": {"mode": "on", "method": "lookahead", "num_speculative_tokens": 2,
                          "num_branches": 1, "details": True,
                          "lookahead": {"window": 2, "ngram": 3, "guesses": 1}},
          "user": "u", "presence_penalty": 0.5, "frequency_penalty": -0.5,
          "repetition_penalty": 1.1, "logit_bias": {"7": 5, "3": -100}, "min_tokens": 2,
          "bad_words": ["foo bar"], "allowed_token_ids": [3, 7, 9], "cache_salt": "tenant-a",
          "response_format": {"type": "text"}, "structured_outputs": {"regex": "[a-z]+"}}
COMPLETION = {**COMMON, "prompt": "x", "logprobs": 2, "best_of": 1, "echo": False,
              "suffix": None}
CHAT = {**{k: v for k, v in COMMON.items() if k != "max_tokens"},
        "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}], "name": "a"},
                     {"role": "assistant", "content": None, "tool_calls": [{
                         "id": "c", "type": "function",
                         "function": {"name": "f", "arguments": "{}"}}]},
                     {"role": "tool", "content": "1", "tool_call_id": "c"}],
        "max_completion_tokens": 4, "logprobs": True, "top_logprobs": 3,
        "tools": [{"type": "function", "function": {
            "name": "f", "description": "d", "parameters": {"type": "object"}, "strict": False}}],
        "tool_choice": "none", "parallel_tool_calls": True}


def test_a_body_with_every_described_field_parses(doc):
    """The described fields are exactly those a body may have: one with all of them parses
    into the dataclasses; a field not described is refused naming it."""
    described = set(body_schema(doc, "/v1/completions")["properties"])
    assert set(COMPLETION) == described
    r = parse_completion_request(COMPLETION)
    s = r.sampling
    assert r.generation.top_logprobs == 2 and r.speculation.lookahead.window == 2
    assert (s.presence_penalty, s.frequency_penalty, s.repetition_penalty, s.min_tokens) == \
        (0.5, -0.5, 1.1, 2)
    assert s.logit_bias == ((3, -100.0), (7, 5.0))  # ids ascending
    assert (s.bad_words, s.allowed_token_ids) == (("foo bar",), (3, 7, 9))
    chat_described = set(body_schema(doc, "/v1/chat/completions")["properties"])
    assert set(CHAT) | {"max_tokens"} == chat_described
    chat = parse_chat_request(CHAT).generation
    assert chat.top_logprobs == 3 and chat.sampling == s
    assert s.structured == StructuredOutput(StructuredKind.REGEX, "[a-z]+")


def test_every_object_refuses_what_it_does_not_describe(doc):
    for name in ("CompletionBody", "ChatBody", "Speculation", "Lookahead", "Message",
                 "TextPart", "StreamOptions", "ResponseFormat", "JsonSchemaFormat",
                 "StructuredOutputs"):
        assert schema(doc, name)["additionalProperties"] is False, name
    # prompt lookup's range shapes ngram, which COMMON's lookahead request cannot name
    assert set(schema(doc, "Speculation")["properties"]) == set(COMMON["speculation"]) | {
        "prompt_lookup_min", "prompt_lookup_max"}
    assert set(schema(doc, "Message")["properties"]) == {k for m in CHAT["messages"] for k in m}


def test_prompt_lookups_range_is_described_with_its_bounds(doc):
    props = schema(doc, "Speculation")["properties"]
    for name in ("prompt_lookup_min", "prompt_lookup_max"):
        p = nonnull(props[name])
        assert (p["type"], p["minimum"], p["maximum"]) == ("integer", 1, MAX_PROMPT_LOOKUP_N)


def test_the_sampling_fields_are_described_with_their_ranges(doc):
    for path in ("/v1/completions", "/v1/chat/completions"):
        props = body_schema(doc, path)["properties"]
        for name in ("presence_penalty", "frequency_penalty"):
            p = nonnull(props[name])
            assert (p["type"], p["minimum"], p["maximum"]) == ("number", -MAX_PENALTY,
                                                               MAX_PENALTY)
        p = nonnull(props["repetition_penalty"])
        assert (p["minimum"], p["maximum"]) == (MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY)
        p = nonnull(props["logit_bias"])
        assert p["type"] == "object" and p["maxProperties"] == MAX_LOGIT_BIAS_ENTRIES
        assert p["additionalProperties"] is False
        ((pattern, bias),) = p["patternProperties"].items()
        assert re.match(pattern, "50256") and not re.match(pattern, "x1")
        assert not re.match(pattern, "-1") and not re.match(pattern, "007")
        assert (bias["minimum"], bias["maximum"]) == (-MAX_LOGIT_BIAS, MAX_LOGIT_BIAS)
        p = nonnull(props["min_tokens"])
        assert (p["type"], p["minimum"]) == ("integer", 0)
        p = nonnull(props["bad_words"])
        assert p["maxItems"] == MAX_BAD_WORDS
        assert (p["items"]["minLength"], p["items"]["maxLength"]) == (1, MAX_BAD_WORD_CHARS)
        p = nonnull(props["allowed_token_ids"])
        assert p["maxItems"] == MAX_ALLOWED_TOKEN_IDS and p["items"]["minimum"] == 0
        assert all(props[name].get("description") for name in (
            "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias",
            "min_tokens", "bad_words", "allowed_token_ids"))


def test_neutral_only_fields_are_described_with_their_one_value(doc):
    props = body_schema(doc, "/v1/completions")["properties"]
    assert nonnull(props["best_of"])["const"] == 1
    assert nonnull(props["echo"])["const"] is False
    assert props["suffix"]["type"] == "null"


def test_the_prompt_list_is_bounded_by_the_deployments_max_prompts():
    _, doc = document(max_prompts=3)
    variants = body_schema(doc, "/v1/completions")["properties"]["prompt"]["anyOf"]
    bounded = [v.get("maxItems") for v in variants if v.get("type") == "array"]
    assert bounded == [3, None, 3]  # strings, one prompt's token ids, token-id lists
    with pytest.raises(InvalidArgument) as e:
        parse_completion_request({"prompt": ["a"] * 4}, max_prompts=3)
    assert e.value.field == "prompt"


def test_the_method_pattern_describes_both_hybrid_spellings(doc):
    method = nonnull(schema(doc, "Speculation")["properties"]["method"])
    pattern = method["anyOf"][1]["pattern"]
    for ok in ("hybrid:suffix+eagle", "hybrid:suffix|eagle", "hybrid:ngram+suffix|eagle"):
        assert re.match(pattern, ok), ok
    assert not re.match(pattern, "hybrid:suffix") and not re.match(pattern, "hybrid:suffix|")


def documented_fields() -> dict[str, list[str]]:
    """docs/api.md's table of the fields a request can send: its verdict column's first word
    (accepted, only, refused) -> the fields named in those rows."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    table = text.split("### Fields a request can send", 1)[1].split("\n\n", 2)[2]
    out: dict[str, list[str]] = {}
    for row in table.split("\n\n", 1)[0].splitlines()[2:]:
        names, _, verdict = [cell.strip() for cell in row.strip("|").split("|")]
        if names.startswith("message "):
            continue  # what a message may hold: tests/gateway/test_chat_api.py
        out.setdefault(verdict.split()[0].rstrip(":"), []).extend(re.findall(r"`([^`]+)`",
                                                                             names))
    return out


def test_the_documented_table_of_fields_is_what_the_declarations_accept(doc):
    """Each field docs/api.md says is accepted is declared, each declared field is in the
    table, and each it says is refused gets a 400 naming it, on both endpoints."""
    table = documented_fields()
    assert set(table) == {"accepted", "only", "refused"}
    completion = set(body_schema(doc, "/v1/completions")["properties"])
    chat = set(body_schema(doc, "/v1/chat/completions")["properties"])
    listed = {name.partition(".")[0] for name in table["accepted"] + table["only"]}
    assert listed - {"messages", "prompt"} <= completion | chat
    assert completion | chat <= listed
    assert set(table["only"]) <= completion
    bodies = ((COMPLETION, parse_completion_request), (CHAT, parse_chat_request))
    for name in table["refused"]:
        parent, _, child = name.partition(".")
        for body, parse in bodies:
            sent = {**body, parent: {child: True}} if child else {**body, name: None}
            with pytest.raises(InvalidArgument) as e:
                parse(sent)
            assert e.value.field == name, name
