"""The verifier's span builder, fed synthetic RequestTimelines: the request span started at
Generate under the incoming context, queue / prefill / decode children with the timeline's
timestamps, per-step detail as events (or child spans), the context put on Propose messages,
and spans that end even when the engine never reports the request."""

from __future__ import annotations

import asyncio

import pytest
from clocks import ManualClockLoop
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from protos import proposer_pb2
from splitspec.telemetry.tracing import ns
from verifier_service.telemetry.stats import RequestTimeline, StepRecord
from verifier_service.telemetry.tracing import ProposeContextInterceptor, VerifierTracer

GRACE_S = 5.0  # the tracer's default: how long a settled request waits for its timeline


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider.get_tracer("test"), exporter
    provider.shutdown()


def timeline(request_id: str = "r1") -> RequestTimeline:
    """Queued 0.1 s, prefilled in two chunks, then three decode steps."""
    return RequestTimeline(
        request_id, "ngram", arrival=100.0, admitted=100.1, first_token=100.3, finished=100.6,
        finish_reason="length", prompt_tokens=40, completion_tokens=6, steps=[
            StepRecord(100.1, 100.2, 0, 0, prefill_tokens=32),
            StepRecord(100.2, 100.3, 0, 0, prefill_tokens=8),
            StepRecord(100.3, 100.4, 3, 2, 0, round_trip_s=0.004),
            StepRecord(100.4, 100.5, 3, 0, 0, round_trip_s=0.003),
            StepRecord(100.5, 100.6, 3, 3, 0, round_trip_s=0.002)])


def by_name(exporter) -> dict:
    return {s.name: s for s in exporter.get_finished_spans()}


def test_timeline_becomes_queue_prefill_decode_under_the_request_span(spans):
    tracer, exporter = spans
    vt = VerifierTracer(tracer, model="target")
    with tracer.start_as_current_span("grpc-server") as server:
        vt.begin("r1", "ngram", 3)
    vt.on_request_done(timeline())
    s = by_name(exporter)
    req = s["splitspec.verifier.request"]
    assert req.parent.span_id == server.get_span_context().span_id
    assert req.end_time == ns(100.6)
    assert req.attributes["gen_ai.usage.output_tokens"] == 6
    assert req.attributes["splitspec.speculation.accepted_tokens"] == 5
    for name, (start, end) in {"splitspec.verifier.queue": (100.0, 100.1),
                               "splitspec.verifier.prefill": (100.1, 100.3),
                               "splitspec.verifier.decode": (100.3, 100.6)}.items():
        child = s[name]
        assert child.parent.span_id == req.context.span_id, name
        assert child.context.trace_id == server.get_span_context().trace_id
        assert (child.start_time, child.end_time) == (ns(start), ns(end)), name
    prefill, decode = s["splitspec.verifier.prefill"], s["splitspec.verifier.decode"]
    assert [e.attributes["splitspec.step.prefill_tokens"] for e in prefill.events] == [32, 8]
    assert [(e.attributes["splitspec.step.k"], e.attributes["splitspec.step.accepted"])
            for e in decode.events] == [(3, 2), (3, 0), (3, 3)]
    first = decode.events[0]
    assert first.timestamp == ns(100.3)
    assert first.attributes["splitspec.step.proposer_round_trip_s"] == 0.004
    assert first.attributes["splitspec.step.seconds"] == pytest.approx(0.1)
    assert vt.carriers == {}  # nothing left behind


def test_per_step_child_spans_when_asked(spans):
    tracer, exporter = spans
    vt = VerifierTracer(tracer, step_detail="spans")
    vt.begin("r1", "ngram", 3)
    vt.on_request_done(timeline())
    steps = [s for s in exporter.get_finished_spans() if s.name == "splitspec.verifier.step"]
    decode = by_name(exporter)["splitspec.verifier.decode"]
    assert len(steps) == 5 and not decode.events
    assert sum(1 for s in steps if s.parent.span_id == decode.context.span_id) == 3


def test_propose_messages_carry_the_request_context(spans):
    tracer, _ = spans
    vt = VerifierTracer(tracer)
    req_span = vt.begin("r1", "ngram", 3).span
    traceparent = vt.carriers["r1"]["traceparent"]
    assert traceparent.split("-")[2] == format(req_span.get_span_context().span_id, "016x")

    async def sent():
        async def requests():
            yield proposer_pb2.ProposeRequest(step_id=1, sequences=[
                proposer_pb2.SequenceStep(seq_id="r1"), proposer_pb2.SequenceStep(seq_id="x")])
        return [r async for r in ProposeContextInterceptor(vt)._annotate(requests())]

    (msg,) = asyncio.run(sent())
    assert msg.sequences[0].trace_context["traceparent"] == traceparent
    assert not msg.sequences[1].trace_context  # not a traced request here


def test_spans_end_without_a_timeline(spans):
    tracer, exporter = spans
    vt = VerifierTracer(tracer, grace_s=GRACE_S)
    failed = vt.begin("failed", None, 0)
    vt.fail(failed, ValueError("max_tokens: too large"))
    vt.settle(failed)
    lost = vt.begin("lost", None, 0)

    async def settle():
        vt.settle(lost)

    loop = ManualClockLoop()
    try:
        loop.run_until_complete(settle())
        loop.advance(GRACE_S * 0.99)
        assert not lost.ended  # within the grace period its timeline may still come
        loop.advance(GRACE_S * 0.02)
    finally:
        loop.close()
    finished = {s.attributes["splitspec.request_id"]: s for s in exporter.get_finished_spans()}
    assert len(exporter.get_finished_spans()) == 2  # each ended once
    assert finished["failed"].status.status_code is StatusCode.ERROR
    assert finished["lost"].attributes["splitspec.timeline"] == "missing"
    assert vt.carriers == {} and vt._open == {}
    vt.on_request_done(timeline("lost"))  # a late timeline is ignored, never raises


def test_a_duplicate_request_id_leaves_the_first_request_traced(spans):
    tracer, exporter = spans
    vt = VerifierTracer(tracer)
    first = vt.begin("r1", "ngram", 3)
    carrier = vt.carriers["r1"]
    dup = vt.begin("r1", "ngram", 3)  # the engine refuses it
    vt.fail(dup, ValueError("request_id: 'r1' is already in use"))
    vt.settle(dup)
    assert vt.carriers["r1"] == carrier and vt._open["r1"] is first
    vt.on_request_done(timeline("r1"))
    vt.settle(first)
    requests = [s for s in exporter.get_finished_spans()
                if s.name == "splitspec.verifier.request"]
    assert [s.status.status_code for s in requests] == [StatusCode.ERROR, StatusCode.UNSET]


def test_an_unsampled_request_records_nothing_and_sends_no_context():
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    vt = VerifierTracer(provider.get_tracer("t"))
    vt.begin("r1", "ngram", 3)
    assert vt.carriers == {}
    vt.on_request_done(timeline())
    assert exporter.get_finished_spans() == ()
