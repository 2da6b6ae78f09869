"""A proposer's telemetry through its servicer: one span per Propose message that carries a
traced request (parent: the first request's context, links: the others), none for untraced
messages, and counters of messages, drafted tokens and RESYNC answers."""

from __future__ import annotations

import asyncio

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from proposer_service.ngram import NgramProposer
from proposer_service.servicer import ProposerServicer
from proposer_service.telemetry.metrics import ProposerMetrics
from proposer_service.telemetry.tracing import ProposerTracer
from protos import proposer_pb2

TRACE_A = "0af7651916cd43dd8448eb211c80319c"
TRACE_B = "4bf92f3577b34da6a3ce929d0e0e4736"


def traceparent(trace_id: str, span_id: str = "b7ad6b7169203331") -> dict[str, str]:
    return {"traceparent": f"00-{trace_id}-{span_id}-01"}


def run(servicer: ProposerServicer, requests: list) -> list:
    async def go():
        async def it():
            for r in requests:
                yield r
        return [resp async for resp in servicer.Propose(it(), None)]
    return asyncio.run(go())


def seq(seq_id: str, tokens: list[int], k: int, full: bool = True, ctx: dict | None = None):
    return proposer_pb2.SequenceStep(seq_id=seq_id, new_tokens=tokens, full_history=full,
                                     history_len=len(tokens), k=k, trace_context=ctx or {})


def test_one_span_per_traced_message_and_counters():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    registry = CollectorRegistry()
    metrics = ProposerMetrics(registry, "ngram")
    servicer = ProposerServicer(NgramProposer(), metrics,
                                ProposerTracer(provider.get_tracer("t"), "ngram"))
    history = [5, 6, 7, 8, 5, 6, 7]
    responses = run(servicer, [
        proposer_pb2.ProposeRequest(step_id=1, sequences=[  # two traced requests
            seq("a", history, 3, ctx=traceparent(TRACE_A)),
            seq("b", history, 2, ctx=traceparent(TRACE_B))]),
        proposer_pb2.ProposeRequest(step_id=2, sequences=[seq("c", history, 2)]),  # untraced
        proposer_pb2.ProposeRequest(step_id=3, sequences=[  # unknown sequence as a delta
            seq("zz", [1], 2, full=False, ctx=traceparent(TRACE_A))], released=["a"]),
    ])
    assert [r.step_id for r in responses] == [1, 2, 3]
    spans = exporter.get_finished_spans()
    assert [s.attributes["splitspec.proposer.step_id"] for s in spans] == [1, 3]
    first = spans[0]
    assert first.name == "splitspec.proposer.propose"
    assert format(first.context.trace_id, "032x") == TRACE_A
    assert format(first.parent.span_id, "016x") == "b7ad6b7169203331"
    assert [format(link.context.trace_id, "032x") for link in first.links] == [TRACE_B]
    assert first.attributes["splitspec.proposer.proposed_tokens"] == 5  # 3 + 2 from the pattern
    assert spans[1].attributes["splitspec.proposer.resyncs"] == 1
    samples = {(s.name, tuple(s.labels.values())): s.value
               for f in text_string_to_metric_families(generate_latest(registry).decode())
               for s in f.samples}
    assert samples[("splitspec_proposer_propose_messages_total", ("ngram",))] == 3
    assert samples[("splitspec_proposer_sequences_total", ("ngram",))] == 4
    assert samples[("splitspec_proposer_proposed_tokens_total", ("ngram",))] == 7
    assert samples[("splitspec_proposer_resyncs_total", ("ngram",))] == 1
    assert samples[("splitspec_proposer_released_sequences_total", ("ngram",))] == 1
    assert samples[("splitspec_proposer_streams", ("ngram",))] == 0  # the stream ended
    assert samples[("splitspec_proposer_propose_seconds_count", ("ngram",))] == 3


def test_without_telemetry_the_servicer_answers_as_before():
    (resp,) = run(ProposerServicer(NgramProposer()), [proposer_pb2.ProposeRequest(
        step_id=7, sequences=[seq("a", [1, 2, 3, 1, 2], 2)])])
    assert resp.step_id == 7 and list(resp.drafts[0].tokens) == [3, 1]
