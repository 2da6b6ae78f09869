"""/openapi.json stays true: every route of the app is described with its methods, and every
request schema lists exactly the fields its parser accepts (extensions included)."""

from __future__ import annotations

from gateway.chat import CHAT_FIELDS, MESSAGE_FIELDS, parse_chat_request
from gateway.openai_api import COMPLETION_FIELDS, SPECULATION_FIELDS, parse_completion_request
from gateway.openapi_schema import CHAT_REQUEST, COMPLETION_REQUEST, MESSAGE, SPECULATION
from gateway.rest import build_app


class NoPool:
    replicas: list = []


def document():
    app = build_app(frontend=type("F", (), {"tracer": None, "metrics": None, "pool": NoPool})())
    from starlette.testclient import TestClient

    with TestClient(app) as client:
        return app, client.get("/openapi.json").json()


def test_every_route_of_the_app_is_described():
    app, doc = document()
    for route in app.routes:
        for method in route.methods - {"HEAD"}:
            assert method.lower() in doc["paths"][route.path], (route.path, method)
    assert {"/v1/chat/completions", "/ready", "/openapi.json"} <= set(doc["paths"])


def test_request_schemas_list_exactly_the_fields_the_parsers_accept():
    assert set(COMPLETION_REQUEST["properties"]) == COMPLETION_FIELDS
    assert set(CHAT_REQUEST["properties"]) == CHAT_FIELDS
    assert set(SPECULATION["properties"]) == set(SPECULATION_FIELDS)
    assert set(MESSAGE["properties"]) == set(MESSAGE_FIELDS)
    assert COMPLETION_REQUEST["additionalProperties"] is False


def test_a_body_with_every_described_field_parses():
    """Each described field is really accepted (with a value its schema allows)."""
    common = {"model": "m", "max_tokens": 4, "temperature": 0.5, "top_p": 0.9, "top_k": 3,
              "min_p": 0.1, "seed": 1, "stop": ["\n"], "stop_token_ids": [2], "n": 2,
              "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": False,
              "speculation": {"mode": "on", "method": "ngram", "num_speculative_tokens": 2,
                              "details": True},
              "user": "u", "presence_penalty": 0, "frequency_penalty": 0, "logit_bias": None,
              "cache_salt": "tenant-a"}
    completion = {**common, "prompt": "x", "logprobs": 2, "best_of": 1, "echo": False,
                  "suffix": None}
    assert set(completion) == COMPLETION_FIELDS
    assert parse_completion_request(completion).generation.top_logprobs == 2
    chat = {**common, "messages": [{"role": "user", "content": "x", "name": "a"}],
            "logprobs": True, "top_logprobs": 3}
    chat.pop("max_tokens")
    chat["max_completion_tokens"] = 4
    assert set(chat) | {"max_tokens"} == CHAT_FIELDS
    assert parse_chat_request(chat).generation.top_logprobs == 3


def test_the_method_pattern_describes_both_hybrid_spellings():
    import re

    pattern = SPECULATION["properties"]["method"]["anyOf"][1]["pattern"]
    for ok in ("hybrid:suffix+eagle", "hybrid:suffix|eagle", "hybrid:ngram+suffix|eagle"):
        assert re.match(pattern, ok), ok
    assert not re.match(pattern, "hybrid:suffix") and not re.match(pattern, "hybrid:suffix|")
