"""The OpenAPI 3.0 description served at /openapi.json: every public route and every request
field, the extensions included. tests/gateway/test_openapi_schema.py keeps it true: each route
of the app is described, and each request schema lists exactly the fields its parser accepts."""

from __future__ import annotations

from typing import Any

from gateway.chat import CHAT_ROLES
from gateway.openai_api import MAX_N
from splitspec.methods import HYBRID, method_names
from splitspec.params import (
    MAX_CACHE_SALT_CHARS,
    MAX_INT32,
    MAX_LOOKAHEAD_GUESSES,
    MAX_LOOKAHEAD_NGRAM,
    MAX_LOOKAHEAD_WINDOW,
    MAX_TOP_LOGPROBS,
)

_INT32 = {"type": "integer", "minimum": 0, "maximum": MAX_INT32}
_TOKEN_IDS = {"type": "array", "items": _INT32}


def _nullable(schema: dict) -> dict:
    return {**schema, "nullable": True}


def _only(value: Any, description: str) -> dict:
    """A field accepted for compatibility with its default value only."""
    return {"nullable": True, "enum": [value], "description": description}


SPECULATION = {
    "type": "object", "additionalProperties": False, "nullable": True,
    "description": "Extension: speculative decoding for this request.",
    "properties": {
        "mode": {"type": "string", "enum": ["auto", "on", "off"],
                 "description": "auto (default): the gateway's policy decides"},
        "method": {"type": "string",
                   "anyOf": [{"enum": list(method_names())},
                             {"pattern": f"^{HYBRID}:[a-z]+([+|][a-z]+)+$"}],
                   "description": "which proposer; default: the deployment's first. "
                   f"{HYBRID}:<method>+<method>: their drafts merged into one token tree "
                   "per step (e.g. hybrid:suffix+eagle), in priority order; "
                   f"{HYBRID}:<method>|<method>: gated, the next one drafts only where the "
                   "one before drafted nothing (e.g. hybrid:suffix|eagle)"},
        "num_speculative_tokens": {**_INT32, "description": "k; 0 turns speculation off"},
        "num_branches": {**_INT32, "description": "token trees: children per draft node at "
                         "most (1: a chain); num_speculative_tokens is the tree's node budget"},
        "details": {"type": "boolean",
                    "description": "report acceptance per draft position and per step"},
        "lookahead": {
            "type": "object", "additionalProperties": False, "nullable": True,
            "description": "lookahead decoding's shape (method lookahead); unset fields take "
                           "the verifier's defaults",
            "properties": {
                "window": {"type": "integer", "minimum": 1, "maximum": MAX_LOOKAHEAD_WINDOW,
                           "description": "W: Jacobi window width"},
                "ngram": {"type": "integer", "minimum": 2, "maximum": MAX_LOOKAHEAD_NGRAM,
                          "description": "N: n-gram size (the window holds N - 1 levels)"},
                "guesses": {"type": "integer", "minimum": 0, "maximum": MAX_LOOKAHEAD_GUESSES,
                            "description": "G: candidate n-grams verified per step"},
            },
        },
    },
}

GENERATION_PROPERTIES = {
    "model": {"type": "string", "nullable": True},
    "max_tokens": _nullable({"type": "integer", "minimum": 1, "maximum": MAX_INT32}),
    "temperature": _nullable({"type": "number", "minimum": 0, "description": "0: greedy"}),
    "top_p": _nullable({"type": "number", "exclusiveMinimum": True, "minimum": 0,
                        "maximum": 1}),
    "top_k": _nullable({"type": "integer", "minimum": -1, "maximum": MAX_INT32,
                        "description": "extension; 0 or -1: off"}),
    "min_p": _nullable({"type": "number", "minimum": 0, "maximum": 1,
                        "description": "extension; 0: off"}),
    "seed": _nullable({"type": "integer", "minimum": 0, "maximum": 2**63 - 1,
                       "description": "choice i of n draws with seed + i"}),
    "stop": {"nullable": True, "oneOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "maxItems": 16, "items": {"type": "string", "minLength": 1}}]},
    "stop_token_ids": _nullable({**_TOKEN_IDS, "description": "extension"}),
    "n": _nullable({"type": "integer", "minimum": 1, "maximum": MAX_N}),
    "stream": _nullable({"type": "boolean"}),
    "stream_options": {"type": "object", "nullable": True, "properties": {
        "include_usage": {"type": "boolean"}}},
    "ignore_eos": _nullable({"type": "boolean", "description": "extension"}),
    "speculation": SPECULATION,
    "cache_salt": _nullable({"type": "string", "maxLength": MAX_CACHE_SALT_CHARS,
                             "description": "prefix-cache isolation: KV blocks are shared only "
                             "between requests with the same salt (vLLM's name)"}),
    "user": {"type": "string", "nullable": True, "description": "accepted and ignored"},
    "presence_penalty": _only(0, "only 0"),
    "frequency_penalty": _only(0, "only 0"),
    "logit_bias": _only(None, "not supported"),
}

def completion_request(max_prompts: int = 16) -> dict:
    return {**COMPLETION_REQUEST, "properties": {**COMPLETION_REQUEST["properties"], "prompt": {
        "oneOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "minItems": 1, "maxItems": max_prompts,
             "items": {"type": "string", "minLength": 1}},
            {**_TOKEN_IDS, "minItems": 1},
            {"type": "array", "minItems": 1, "maxItems": max_prompts,
             "items": {**_TOKEN_IDS, "minItems": 1}}]}}}


COMPLETION_REQUEST = {
    "type": "object", "additionalProperties": False, "required": ["prompt"],
    "properties": {
        "prompt": {},  # completion_request() fills it in: it depends on --max-prompts
        "logprobs": _nullable({"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS,
                               "description": "log-probabilities with this many alternatives"}),
        "best_of": _only(1, "only 1"),
        "echo": _only(False, "only false"),
        "suffix": _only(None, "not supported"),
        **GENERATION_PROPERTIES,
    },
}

MESSAGE = {
    "type": "object", "additionalProperties": False, "required": ["role", "content"],
    "properties": {
        "role": {"type": "string", "enum": list(CHAT_ROLES)},
        "content": {"oneOf": [
            {"type": "string"},
            {"type": "array", "items": {
                "type": "object", "additionalProperties": False, "required": ["type", "text"],
                "properties": {"type": {"type": "string", "enum": ["text"]},
                               "text": {"type": "string"}}}}]},
        "name": {"type": "string", "nullable": True},
    },
}

CHAT_REQUEST = {
    "type": "object", "additionalProperties": False, "required": ["messages"],
    "properties": {
        "messages": {"type": "array", "minItems": 1, "items": MESSAGE},
        "max_completion_tokens": _nullable({"type": "integer", "minimum": 1,
                                            "maximum": MAX_INT32,
                                            "description": "alias of max_tokens"}),
        "logprobs": _nullable({"type": "boolean"}),
        "top_logprobs": _nullable({"type": "integer", "minimum": 0,
                                   "maximum": MAX_TOP_LOGPROBS,
                                   "description": "needs logprobs: true"}),
        **GENERATION_PROPERTIES,
    },
}

_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": "string", "nullable": True,
                             "description": "the request field at fault"},
                   "code": {"type": "integer"}}}}}
_OBJECT = {"type": "object"}


def _json(schema: dict) -> dict:
    return {"application/json": {"schema": schema}}


def _responses(ok: dict, ok_media: dict | None = None, *errors: int) -> dict:
    out = {"200": {"description": "OK", "content": ok_media or _json(ok)}}
    for code in errors:
        out[str(code)] = {"description": "error", "content": _json(_ERROR)}
    return out


_GENERATION_ERRORS = (400, 401, 404, 408, 413, 429, 503)
_STREAM = {**_json(_OBJECT), "text/event-stream": {"schema": {"type": "string"}}}

OPERATIONS: dict[tuple[str, str], dict] = {
    ("/v1/completions", "post"): {
        "summary": "Text completion (OpenAI-compatible)",
        "requestBody": {"required": True, "content": _json(completion_request())},
        "responses": _responses(_OBJECT, _STREAM, *_GENERATION_ERRORS)},
    ("/v1/chat/completions", "post"): {
        "summary": "Chat completion (OpenAI-compatible)",
        "requestBody": {"required": True, "content": _json(CHAT_REQUEST)},
        "responses": _responses(_OBJECT, _STREAM, *_GENERATION_ERRORS)},
    ("/v1/models", "get"): {"summary": "The served model and its speculation methods",
                            "responses": _responses(_OBJECT, None, 401, 503)},
    ("/health", "get"): {"summary": "200 while a verifier is SERVING, else 503",
                         "responses": _responses(_OBJECT, None, 503)},
    ("/ready", "get"): {"summary": "200 once a verifier is up with its model loaded",
                        "responses": _responses(_OBJECT, None, 503)},
    ("/openapi.json", "get"): {"summary": "This description",
                               "responses": _responses(_OBJECT)},
}


def openapi_schema(routes, max_prompts: int = 16) -> dict:
    """The document for the app's routes (each must have an entry in OPERATIONS)."""
    paths: dict[str, dict] = {}
    for route in routes:
        for method in sorted(route.methods - {"HEAD"}):
            paths.setdefault(route.path, {})[method.lower()] = \
                OPERATIONS[(route.path, method.lower())]
    completions = paths.get("/v1/completions", {}).get("post")
    if completions is not None:
        paths["/v1/completions"]["post"] = {**completions, "requestBody": {
            "required": True, "content": _json(completion_request(max_prompts))}}
    return {
        "openapi": "3.0.3",
        "info": {"title": "splitspec gateway", "version": "1",
                 "description": "OpenAI-compatible REST API with speculative decoding "
                 "extensions; see docs/api.md."},
        "components": {"securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}}},
        "paths": paths,
    }
