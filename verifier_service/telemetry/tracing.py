"""The verifier's spans, built from each request's RequestTimeline when it ends.

    /splitspec.v1.Verifier/Generate            (gRPC server span, parent from the metadata)
      splitspec.verifier.request               started live by the servicer at Generate
        splitspec.verifier.queue               arrival -> first scheduled
        splitspec.verifier.prefill             first scheduled -> first token; one event per chunk
        splitspec.verifier.decode              first token -> finished; one event per step
        splitspec.proposer.propose             (proposer service) one per Propose message

The engine runs a step for a whole batch, so the request's children are made after the fact,
with the timeline's timestamps. Only the request span is started live, at Generate time, under
the gRPC server span: its context goes on every Propose message that carries one of the
request's sequences (ProposeContextInterceptor), so the proposer's spans join the trace.

Per-step detail (k, accepted, proposer round trip, step time) is a span event per step by
default; `step_detail="spans"` makes child spans instead. bench/observability_bench.py measures
both; events cost less (bench/reports/observability.md). The SDK keeps at most
OTEL_SPAN_EVENT_COUNT_LIMIT (default 128) events per span; the decode span's attributes carry
the totals regardless.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import grpc
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from splitspec.telemetry.tracing import carrier_of, ns
from verifier_service.telemetry.stats import RequestTimeline, StepRecord, StepStats

log = logging.getLogger(__name__)

PROPOSE_METHOD = "/splitspec.v1.Proposer/Propose"
STEP_DETAILS = ("events", "spans")


@dataclass(eq=False)
class OpenRequest:
    """A request's span from Generate until it ends."""

    request_id: str
    span: trace.Span
    carrier: dict[str, str] | None  # W3C context for Propose messages; None: not recorded
    ended: bool = False


class VerifierTracer:
    """EngineObserver. The servicer calls `begin` when a request arrives and `settle` when its
    stream ends; the engine calls `on_request_done` with the request's timeline."""

    def __init__(self, tracer: trace.Tracer, model: str = "", step_detail: str = "events",
                 grace_s: float = 5.0):
        if step_detail not in STEP_DETAILS:
            raise ValueError(f"step_detail: {step_detail!r} is not one of {STEP_DETAILS}")
        self._tracer = tracer
        self._model = model
        self._step_detail = step_detail
        self._grace_s = grace_s
        self._open: dict[str, OpenRequest] = {}
        # request id -> W3C carrier, read per Propose message; only recorded requests.
        self.carriers: dict[str, dict[str, str]] = {}

    def begin(self, request_id: str, method: str | None, k: int) -> OpenRequest:
        """Start the request's span under the current context (the gRPC server span)."""
        attributes = {"splitspec.request_id": request_id,
                      "splitspec.speculation.method": method or "none",
                      "splitspec.speculation.num_speculative_tokens": k}
        if self._model:
            attributes["gen_ai.request.model"] = self._model
        span = self._tracer.start_span("splitspec.verifier.request", attributes=attributes)
        entry = OpenRequest(request_id, span, carrier_of(span) if span.is_recording() else None)
        if request_id not in self._open:  # the engine refuses a duplicate id: keep the first
            self._open[request_id] = entry
            if entry.carrier is not None:
                self.carriers[request_id] = entry.carrier
        return entry

    def fail(self, entry: OpenRequest, exc: BaseException) -> None:
        """The request failed before or outside the engine: end its span with the error."""
        self._take(entry)
        if not entry.ended:
            entry.span.record_exception(exc)
            entry.span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            self._end(entry)

    def settle(self, entry: OpenRequest) -> None:
        """The request's stream ended. Its timeline normally arrived already; if the engine
        never reports it (a failed step), the span ends after a grace period anyway."""
        if entry.ended:
            return
        if self._open.get(entry.request_id) is not entry:
            self._end(entry)  # never registered (a duplicate id)
            return
        try:
            asyncio.get_running_loop().call_later(self._grace_s, self._expire, entry)
        except RuntimeError:  # no loop: end it now
            self._expire(entry)

    def _expire(self, entry: OpenRequest) -> None:
        if self._take(entry) and not entry.ended:
            entry.span.set_attribute("splitspec.timeline", "missing")
            self._end(entry)

    def _take(self, entry: OpenRequest) -> bool:
        """Unregister `entry` if it is the one registered for its id."""
        if self._open.get(entry.request_id) is not entry:
            return False
        del self._open[entry.request_id]
        self.carriers.pop(entry.request_id, None)
        return True

    @staticmethod
    def _end(entry: OpenRequest, end_time: int | None = None) -> None:
        entry.ended = True
        entry.span.end(end_time=end_time)

    # -- EngineObserver ------------------------------------------------------------------------

    def on_step(self, step: StepStats) -> None:
        pass  # spans are per request: built from the timeline when it ends

    def on_request_done(self, tl: RequestTimeline) -> None:
        entry = self._open.get(tl.request_id)
        if entry is None or not self._take(entry):
            return
        span = entry.span
        end = tl.finished if tl.finished is not None else max(
            (r.end for r in tl.steps), default=tl.arrival)
        if span.is_recording():
            if tl.finish_reason == "error":
                span.set_status(Status(StatusCode.ERROR, "the request's engine step failed"))
            try:
                self._children(span, tl, end)
            except Exception:  # noqa: BLE001 - observers never raise into the engine
                log.exception("building the spans of %s failed", tl.request_id)
        self._end(entry, ns(end))

    def _children(self, parent: trace.Span, tl: RequestTimeline, end: float) -> None:
        drafted = sum(r.k for r in tl.steps)
        accepted = sum(r.accepted for r in tl.steps)
        parent.set_attributes({
            "gen_ai.usage.input_tokens": tl.prompt_tokens,
            "gen_ai.usage.output_tokens": tl.completion_tokens,
            "gen_ai.response.finish_reasons": [tl.finish_reason or "abort"],
            "splitspec.steps": len(tl.steps),
            "splitspec.speculation.proposed_tokens": drafted,
            "splitspec.speculation.accepted_tokens": accepted,
        })
        if tl.finish_reason == "abort":
            parent.set_attribute("splitspec.aborted", True)
        ctx = trace.set_span_in_context(parent)
        admitted = tl.admitted if tl.admitted is not None else end
        self._span("splitspec.verifier.queue", ctx, tl.arrival, admitted, {})
        if tl.admitted is None:
            return
        first = tl.first_token if tl.first_token is not None else end
        prefill_steps = [r for r in tl.steps if r.prefill_tokens]
        prefill = self._span("splitspec.verifier.prefill", ctx, admitted, first, {
            "splitspec.prompt_tokens": tl.prompt_tokens,
            "splitspec.prefill.chunks": len(prefill_steps)}, end_now=False)
        self._steps(prefill, prefill_steps)
        prefill.end(end_time=ns(first))
        if tl.first_token is None:
            return
        decode_steps = [r for r in tl.steps if not r.prefill_tokens]
        decode = self._span("splitspec.verifier.decode", ctx, first, end, {
            "splitspec.steps": len(decode_steps),
            "splitspec.speculation.proposed_tokens": drafted,
            "splitspec.speculation.accepted_tokens": accepted,
            "splitspec.output_tokens": tl.completion_tokens}, end_now=False)
        self._steps(decode, decode_steps)
        decode.end(end_time=ns(end))

    def _span(self, name: str, ctx, start: float, end: float, attributes: dict,
              end_now: bool = True) -> trace.Span:
        span = self._tracer.start_span(name, context=ctx, attributes=attributes,
                                       start_time=ns(start))
        if end_now:
            span.end(end_time=ns(max(end, start)))
        return span

    def _steps(self, span: trace.Span, records: list[StepRecord]) -> None:
        if self._step_detail == "events":
            for r in records:
                span.add_event("splitspec.step", _step_attributes(r), timestamp=ns(r.start))
            return
        ctx = trace.set_span_in_context(span)
        for r in records:
            self._span("splitspec.verifier.step", ctx, r.start, r.end, _step_attributes(r))


def _step_attributes(r: StepRecord) -> dict:
    a = {"splitspec.step.k": r.k, "splitspec.step.accepted": r.accepted,
         "splitspec.step.seconds": r.end - r.start}
    if r.prefill_tokens:
        a["splitspec.step.prefill_tokens"] = r.prefill_tokens
    if r.round_trip_s is not None:
        a["splitspec.step.proposer_round_trip_s"] = r.round_trip_s
    return a


class ProposeContextInterceptor(grpc.aio.StreamStreamClientInterceptor):
    """On the verifier's proposer channels: puts each traced request's context on the
    SequenceSteps of the Propose messages that carry it (gRPC metadata is per stream, and the
    stream outlives every request)."""

    def __init__(self, tracer: VerifierTracer):
        self._carriers = tracer.carriers

    async def intercept_stream_stream(self, continuation, client_call_details,
                                      request_iterator):
        method = client_call_details.method
        if isinstance(method, bytes):
            method = method.decode()
        if method != PROPOSE_METHOD or request_iterator is None:
            return await continuation(client_call_details, request_iterator)
        return await continuation(client_call_details, self._annotate(request_iterator))

    async def _annotate(self, requests):
        carriers = self._carriers
        async for request in requests:
            if carriers:
                for s in request.sequences:
                    carrier = carriers.get(s.seq_id)
                    if carrier is not None:
                        s.trace_context.update(carrier)
            yield request
