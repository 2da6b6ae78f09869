"""The OpenAPI 3.1 document served at /openapi.json, generated: each request body and the error
body are their declarations' JSON schemas (gateway/request_models.py, gateway/openai_api.py),
and the paths are the app's routes. tests/gateway/test_openapi_schema.py checks that every route
is described and that each body's schema lists exactly what its declaration accepts."""

from __future__ import annotations

import copy
import functools

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from gateway.openai_api import ErrorBody
from gateway.request_models import ChatBody, CompletionBody

REF = "#/components/schemas/{model}"

_GENERATION_ERRORS = (400, 401, 404, 408, 413, 429, 503)
# path -> (summary, request body, error statuses); a generation endpoint may stream
ROUTES: dict[str, tuple[str, type[BaseModel] | None, tuple[int, ...]]] = {
    "/v1/completions": ("Text completion (OpenAI-compatible)", CompletionBody,
                        _GENERATION_ERRORS),
    "/v1/chat/completions": ("Chat completion (OpenAI-compatible)", ChatBody,
                             _GENERATION_ERRORS),
    "/v1/models": ("The served model and its speculation methods", None, (401, 503)),
    "/health": ("200 while a verifier is SERVING, else 503", None, (503,)),
    "/ready": ("200 once a verifier is up with its model loaded", None, (503,)),
    "/openapi.json": ("This description", None, ()),
}


@functools.cache
def _schemas() -> dict:
    """Every declared body's schema (and those of the objects inside), by name."""
    _, top = models_json_schema([(CompletionBody, "validation"), (ChatBody, "validation"),
                                 (ErrorBody, "serialization")], ref_template=REF)
    return top["$defs"]


def _ref(model: type[BaseModel]) -> dict:
    return {"$ref": REF.format(model=model.__name__)}


def openapi_document(routes, max_prompts: int) -> dict:
    """The document of the app's routes (each must have an entry in ROUTES); a completions
    request's prompt list holds at most `max_prompts` prompts (--max-prompts)."""
    schemas = copy.deepcopy(_schemas())
    for variant in schemas["CompletionBody"]["properties"]["prompt"]["anyOf"]:
        if variant.get("type") == "array" and variant["items"].get("type") != "integer":
            variant["maxItems"] = max_prompts  # several prompts, not one prompt's token ids
    paths: dict[str, dict] = {}
    for route in routes:
        summary, body, errors = ROUTES[route.path]
        ok: dict = {"application/json": {"schema": {"type": "object"}}}
        if body is not None:
            ok["text/event-stream"] = {"schema": {"type": "string"}}
        responses = {"200": {"description": "OK", "content": ok}}
        for code in errors:
            responses[str(code)] = {"description": "error", "content": {
                "application/json": {"schema": _ref(ErrorBody)}}}
        operation: dict = {"summary": summary, "responses": responses}
        if body is not None:
            operation["requestBody"] = {"required": True, "content": {
                "application/json": {"schema": _ref(body)}}}
        for method in sorted(route.methods - {"HEAD"}):
            paths.setdefault(route.path, {})[method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "splitspec gateway", "version": "1",
                 "description": "OpenAI-compatible REST API with speculative decoding "
                 "extensions; see docs/api.md."},
        "components": {"schemas": schemas,
                       "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}}},
        "paths": paths,
    }
