"""Prefix caching at the gateway's front doors, against a recording verifier pool: `cache_salt`
checked (400 / INVALID_ARGUMENT naming it) and forwarded; with API keys on, each request salted
by its key unless it gives its own salt; the salt kept when a stream resumes on another replica;
and `usage.prompt_tokens_details.cached_tokens` in every REST usage, as the official `openai`
client parses it."""

from __future__ import annotations

import asyncio
import json

import planted_bugs as bug
import pytest
from starlette.testclient import TestClient
from test_gateway_telemetry import FakePool

from gateway.auth import ApiKeys
from gateway.frontend import Frontend
from gateway.grpc_api import GenerationServicer
from gateway.policy import SpeculationPolicy
from gateway.request_models import parse_chat_request, parse_completion_request
from gateway.rest import RestLimits, build_app
from gateway.resume import StreamProgress
from protos import common_pb2
from splitspec.errors import InvalidArgument

openai = pytest.importorskip("openai")

KEYS = ("key-of-tenant-a", "key-of-tenant-b")
CHAT = [{"role": "user", "content": "hi"}]


class RecordingPool(FakePool):
    """Records what the gateway sends; answers with two tokens, 5 of 9 prompt tokens cached."""

    async def generate(self, request):
        self.requests.append(request)
        yield common_pb2.GenerateResponse(token_ids=[1], text="a")
        yield common_pb2.GenerateResponse(
            token_ids=[2], text="b", finish_reason=common_pb2.FINISH_REASON_LENGTH,
            usage=common_pb2.Usage(prompt_tokens=9, completion_tokens=2, cached_tokens=5))


def rest_app(pool: RecordingPool, keys=()):
    return build_app(Frontend(pool, SpeculationPolicy()),
                     limits=RestLimits(api_keys=ApiKeys(frozenset(keys))))


class Context:
    def __init__(self, key: str | None):
        self._metadata = [("authorization", f"Bearer {key}")] if key else []

    def invocation_metadata(self):
        return self._metadata


def grpc_send(pool: RecordingPool, request: common_pb2.GenerateRequest, key: str | None = None,
              keys=()) -> list[common_pb2.GenerateResponse]:
    servicer = GenerationServicer(Frontend(pool, SpeculationPolicy()),
                                  ApiKeys(frozenset(keys)))

    async def call():
        return [m async for m in servicer.Generate(request, Context(key))]

    return asyncio.run(call())


def salts(pool: RecordingPool) -> list[str | None]:
    return [r.cache_salt if r.HasField("cache_salt") else None for r in pool.requests]


# -- validation ------------------------------------------------------------------------------

@pytest.mark.parametrize("salt", [5, ["a"], {"a": 1}, True, "s" * 257, "a\ud800"])
def test_a_bad_salt_is_refused_naming_the_field(salt):
    for parse in (lambda: parse_completion_request({"prompt": "x", "cache_salt": salt}),
                  lambda: parse_chat_request({"messages": CHAT, "cache_salt": salt})):
        with pytest.raises(InvalidArgument) as e:
            parse()
        assert e.value.field == "cache_salt"


def check_salt_validation_over_the_wire():
    pool = RecordingPool()
    with TestClient(rest_app(pool), raise_server_exceptions=False) as client:
        for path, body in (("/v1/completions", {"prompt": "x"}),
                           ("/v1/chat/completions", {"messages": CHAT})):
            for salt in (7, "s" * 257, "a\ud800"):
                r = client.post(path, content=json.dumps(  # a lone surrogate, escaped
                    {**body, "max_tokens": 2, "cache_salt": salt}),
                    headers={"Content-Type": "application/json"})
                assert r.status_code == 400, r.text
                assert r.json()["error"]["param"] == "cache_salt"
            r = client.post(path, json={**body, "max_tokens": 2, "cache_salt": "s" * 256})
            assert r.status_code == 200, r.text
    with pytest.raises(InvalidArgument) as e:
        grpc_send(pool, common_pb2.GenerateRequest(text="x", cache_salt="s" * 257))
    assert e.value.field == "cache_salt"
    assert salts(pool) == ["s" * 256] * 2  # only the valid ones reached the verifier


def test_salt_validation_over_the_wire():
    check_salt_validation_over_the_wire()


def test_the_check_catches_an_unchecked_salt(monkeypatch):
    bug.cache_salt_unchecked(monkeypatch)
    with pytest.raises(AssertionError):
        check_salt_validation_over_the_wire()


# -- salting by API key ----------------------------------------------------------------------

def check_requests_are_salted_by_their_key():
    pool = RecordingPool()
    with TestClient(rest_app(pool, KEYS)) as client:
        def post(key, **extra):
            r = client.post("/v1/completions", headers={"Authorization": f"Bearer {key}"},
                            json={"prompt": "x", "max_tokens": 2, **extra})
            assert r.status_code == 200, r.text

        post(KEYS[0])
        post(KEYS[1])
        post(KEYS[0])
        post(KEYS[1], cache_salt="shared-by-choice")
    grpc_send(pool, common_pb2.GenerateRequest(text="x"), KEYS[0], KEYS)
    grpc_send(pool, common_pb2.GenerateRequest(text="x", cache_salt="mine"), KEYS[1], KEYS)
    a, b, a_again, own, grpc_a, grpc_own = salts(pool)
    assert a and b and a != b, "two keys must never share a salt"
    assert a_again == a == grpc_a, "one key: one salt, on both doors"
    assert not any(k in s for k in KEYS for s in (a, b)), "the salt must not carry the key"
    assert (own, grpc_own) == ("shared-by-choice", "mine"), "a request's own salt wins"


def test_requests_are_salted_by_their_key():
    check_requests_are_salted_by_their_key()


def test_the_check_catches_a_gateway_that_ignores_the_key(monkeypatch):
    bug.cache_salt_ignores_the_key(monkeypatch)
    with pytest.raises(AssertionError, match="two keys"):
        check_requests_are_salted_by_their_key()


def test_without_keys_only_a_requests_own_salt_is_sent():
    pool = RecordingPool()
    with TestClient(rest_app(pool)) as client:
        for extra in ({}, {"cache_salt": "t"}, {"cache_salt": ""}):
            r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, **extra})
            assert r.status_code == 200, r.text
    grpc_send(pool, common_pb2.GenerateRequest(text="x"))
    assert salts(pool) == [None, "t", "", None]


def check_a_resumed_stream_keeps_its_salt():
    progress = StreamProgress(common_pb2.GenerateRequest(request_id="r", text="x",
                                                         cache_salt="tenant"))
    progress.observe(common_pb2.GenerateResponse(token_ids=[4, 5], text="ab"))
    progress.resumes += 1
    resumed = progress.next_request()
    assert list(resumed.resume.output_token_ids) == [4, 5]
    assert resumed.HasField("cache_salt") and resumed.cache_salt == "tenant"


def test_a_resumed_stream_keeps_its_salt():
    check_a_resumed_stream_keeps_its_salt()


def test_the_check_catches_a_resume_that_drops_the_salt(monkeypatch):
    bug.resume_drops_the_cache_salt(monkeypatch)
    with pytest.raises(AssertionError):
        check_a_resumed_stream_keeps_its_salt()


# -- cached_tokens in usage ------------------------------------------------------------------

def test_cached_tokens_reach_every_usage_and_the_openai_client_parses_them():
    pool = RecordingPool()
    with TestClient(rest_app(pool)) as http:
        oa = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http,
                           max_retries=0)
        out = oa.completions.create(model="target", prompt="x", max_tokens=2)
        assert out.usage.prompt_tokens_details.cached_tokens == 5
        chat = oa.chat.completions.create(model="target", messages=CHAT, max_tokens=2)
        assert chat.usage.prompt_tokens_details.cached_tokens == 5
        chunks = list(oa.chat.completions.create(model="target", messages=CHAT, max_tokens=2,
                                                 stream=True,
                                                 stream_options={"include_usage": True}))
        assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 5
        chunks = list(oa.completions.create(model="target", prompt=["x", "y"], max_tokens=2,
                                            n=2, stream=True,
                                            stream_options={"include_usage": True}))
        # two prompts, two choices each: each prompt (and its cached part) counted once
        usage = chunks[-1].usage
        assert (usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens) == (18, 10)
    # the gRPC door passes the verifier's usage through
    (_, last) = grpc_send(pool, common_pb2.GenerateRequest(text="x"))
    assert last.usage.cached_tokens == 5


@pytest.mark.parametrize("path, body, field", [
    ("/v1/completions", {"prompt": "a\ud800b"}, "prompt"),
    ("/v1/completions", {"prompt": ["ok", "x\udfff"]}, "prompt"),
    ("/v1/completions", {"prompt": "x", "stop": ["\ud83d"]}, "stop"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi \ud800"}]},
     "messages"),
])
def test_a_lone_surrogate_in_any_string_is_a_400_naming_its_field(path, body, field):
    """JSON can escape a lone surrogate, which protobuf cannot encode: refused at the door
    (not a 500 from the wire), saying why, and the service keeps serving."""
    pool = RecordingPool()
    with TestClient(rest_app(pool), raise_server_exceptions=False) as client:
        r = client.post(path, content=json.dumps({**body, "max_tokens": 2}),
                        headers={"Content-Type": "application/json"})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == field
        assert "valid Unicode" in r.json()["error"]["message"]
        ok = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert ok.status_code == 200


def test_the_surrogate_check_fails_when_the_door_lets_them_through(monkeypatch):
    bug.lone_surrogates_let_through(monkeypatch)
    with pytest.raises(AssertionError):
        test_a_lone_surrogate_in_any_string_is_a_400_naming_its_field(
            "/v1/completions", {"prompt": "a\ud800b"}, "prompt")
