"""The gateway's telemetry over a fake verifier pool: the GenAI span of a REST request (child of
its traceparent header, gen_ai.* attributes, current while the verifier is called), the same
for gRPC, the gateway's counters, and per-request speculation details in the JSON usage."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from gateway.frontend import Frontend
from gateway.grpc_api import GenerationServicer
from gateway.metrics import GatewayMetrics
from gateway.policy import SpeculationPolicy
from gateway.request_models import parse_completion_request
from gateway.rest import build_app
from gateway.tracing import GatewayTracer
from protos import common_pb2, verifier_pb2
from splitspec.errors import InvalidArgument
from splitspec.params import SpeculationMode

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"


class FakePool:
    """Answers every generation with 3 tokens; records the span current at each call."""

    def __init__(self):
        self.replicas = []
        self.requests: list[common_pb2.GenerateRequest] = []
        self.current: list[trace.SpanContext] = []

    async def info(self):
        return verifier_pb2.VerifierInfo(
            model="target", max_model_len=512, default_num_speculative_tokens=3,
            max_num_speculative_tokens=8, proposers=[verifier_pb2.ProposerStatus(method="ngram")])

    async def healthy(self):
        return True

    async def generate(self, request):
        self.requests.append(request)
        self.current.append(trace.get_current_span().get_span_context())
        plan = request.speculation_plan
        on = bool(plan.method)
        yield common_pb2.GenerateResponse(token_ids=[1, 2], text="ab")
        spec = common_pb2.SpeculationStats(
            method=plan.method, proposed_tokens=6 if on else 0,
            accepted_tokens=2 if on else 0, steps=2)
        if plan.details:
            spec.accepted_per_position.extend([1, 1, 0])
            spec.step_draft_tokens.extend([3, 3])
            spec.step_accepted_tokens.extend([2, 0])
        yield common_pb2.GenerateResponse(
            token_ids=[3], text="c", finish_reason=common_pb2.FINISH_REASON_LENGTH,
            usage=common_pb2.Usage(prompt_tokens=4, completion_tokens=3, speculation=spec))


@pytest.fixture
def gateway():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    registry = CollectorRegistry()
    pool = FakePool()
    frontend = Frontend(pool, SpeculationPolicy(), GatewayMetrics(registry),
                        GatewayTracer(provider.get_tracer("gateway")))
    yield frontend, pool, exporter, registry
    provider.shutdown()


def samples(registry) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(generate_latest(registry).decode())
            for s in f.samples}


def test_rest_request_span_follows_traceparent_and_the_genai_conventions(gateway):
    frontend, pool, exporter, registry = gateway
    with TestClient(build_app(frontend)) as client:
        r = client.post("/v1/completions", headers={
            "traceparent": f"00-{TRACE_ID}-{PARENT}-01"}, json={
            "prompt": ["x", "y"], "max_tokens": 3, "temperature": 0.5, "top_p": 0.9,
            "speculation": {"mode": "on", "num_speculative_tokens": 3, "details": True}})
    assert r.status_code == 200, r.text
    (span,) = exporter.get_finished_spans()
    assert span.name == "text_completion target" and span.kind is SpanKind.SERVER
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert format(span.parent.span_id, "016x") == PARENT
    a = span.attributes
    assert a["gen_ai.operation.name"] == "text_completion"
    assert (a["gen_ai.request.model"], a["gen_ai.request.max_tokens"],
            a["gen_ai.request.temperature"], a["gen_ai.request.top_p"]) == ("target", 3, 0.5, 0.9)
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (8, 6)
    assert a["gen_ai.response.finish_reasons"] == ("length", "length")
    assert a["gen_ai.response.id"] == r.json()["id"]
    assert a["splitspec.speculation.method"] == "ngram"
    assert a["splitspec.speculation.reason"] == "requested_on"
    # The verifier was called with the gateway span current: gRPC carries it in metadata.
    assert [c.span_id for c in pool.current] == [span.context.span_id] * 2
    assert all(req.speculation_plan.details for req in pool.requests)
    spec = r.json()["usage"]["speculation"]
    assert spec["accepted_per_position"] == [2, 2, 0]  # two prompts, summed per position
    assert spec["step_counts"] == [[3, 2], [3, 0], [3, 2], [3, 0]]
    assert spec["acceptance_per_position"] == [0.5, 0.5, 0.0]
    s = samples(registry)
    assert s[("splitspec_gateway_requests_total", (("api", "rest"), ("code", "200")))] == 1
    assert s[("splitspec_policy_decisions_total", (("decision", "on"), ("method", "ngram"),
                                                   ("reason", "requested_on")))] == 2
    assert s[("splitspec_gateway_generation_tokens_total", (("method", "ngram"),))] == 6
    assert s[("splitspec_gateway_time_to_first_token_seconds_count", ())] == 2


def test_streamed_request_span_ends_with_the_stream(gateway):
    frontend, pool, exporter, registry = gateway
    with TestClient(build_app(frontend)) as client:
        with client.stream("POST", "/v1/completions", json={
                "prompt": "x", "max_tokens": 3, "stream": True,
                "speculation": {"mode": "off"}}) as r:
            body = "".join(r.iter_text())
    assert body.rstrip().endswith("data: [DONE]")
    (span,) = exporter.get_finished_spans()
    assert span.attributes["gen_ai.usage.output_tokens"] == 3
    assert span.attributes["gen_ai.response.finish_reasons"] == ("length",)
    assert span.attributes["splitspec.speculation.method"] == "none"
    assert pool.current[0].span_id == span.context.span_id
    s = samples(registry)
    assert s[("splitspec_policy_decisions_total", (("decision", "off"), ("method", "none"),
                                                   ("reason", "requested_off")))] == 1
    assert s[("splitspec_gateway_generation_tokens_total", (("method", "none"),))] == 3


def test_a_bad_request_ends_its_span_with_an_error(gateway):
    frontend, _, exporter, registry = gateway
    with TestClient(build_app(frontend)) as client:
        assert client.post("/v1/completions", json={"prompt": "x", "max_tokens": 0}
                           ).status_code == 400
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes["error.type"] == "InvalidArgument"
    assert samples(registry)[("splitspec_gateway_requests_total",
                              (("api", "rest"), ("code", "400")))] == 1


def test_grpc_generate_span_sits_under_the_current_span(gateway):
    frontend, pool, exporter, _ = gateway
    parent_tracer = TracerProvider().get_tracer("rpc")

    async def call():
        request = common_pb2.GenerateRequest(
            text="x", stopping=common_pb2.StoppingCriteria(max_tokens=3),
            speculation=common_pb2.SpeculationConfig(mode=common_pb2.SPECULATION_MODE_ON))
        with parent_tracer.start_as_current_span("rpc-server") as rpc:
            out = [m async for m in GenerationServicer(frontend).Generate(request, None)]
        return rpc, out

    rpc, out = asyncio.run(call())
    assert out[-1].usage.completion_tokens == 3
    (span,) = exporter.get_finished_spans()
    assert span.name == "text_completion target" and span.kind is SpanKind.INTERNAL
    assert span.parent.span_id == rpc.get_span_context().span_id
    assert span.attributes["gen_ai.usage.output_tokens"] == 3
    assert span.attributes["splitspec.speculation.reason"] == "requested_on"
    assert pool.current[0].span_id == span.context.span_id


def test_speculation_details_flag_is_parsed_and_checked():
    r = parse_completion_request({"prompt": "x", "speculation": {"details": True}})
    assert r.speculation_details and r.speculation.mode is SpeculationMode.AUTO
    assert not parse_completion_request({"prompt": "x"}).speculation_details
    with pytest.raises(InvalidArgument) as e:
        parse_completion_request({"prompt": "x", "speculation": {"details": "yes"}})
    assert e.value.field == "speculation.details"


def test_a_chat_request_span_is_a_chat_operation(gateway):
    frontend, pool, exporter, _ = gateway
    with TestClient(build_app(frontend)) as client:
        r = client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "abc"
    assert [(m.role, m.content) for m in pool.requests[0].options.messages] == [("user", "hi")]
    (span,) = exporter.get_finished_spans()
    assert span.name == "chat target" and span.attributes["gen_ai.operation.name"] == "chat"
