"""A proposer's spans: one per Propose message that carries a traced request.

A message serves every speculating sequence of one verifier step, so it may belong to several
traces: its span's parent is the first sequence's context (the verifier's request span) and the
other requests' contexts are links. A message with no context (the verifier does not trace)
gets no span: one per step would flood the backend with single-span traces.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind

from splitspec.proposal import Draft
from splitspec.telemetry.tracing import context_from


class ProposerTracer:
    # A request's context is the same on every message of it: parse each traceparent once.
    _CACHE_SIZE = 4096

    def __init__(self, tracer: trace.Tracer, method: str):
        self._tracer = tracer
        self._method = method
        self._contexts: dict[str, tuple] = {}  # traceparent -> (context, span context)

    def _context(self, carrier) -> tuple:
        key = carrier.get("traceparent", "")
        hit = self._contexts.get(key)
        if hit is None:
            ctx = context_from(dict(carrier))
            hit = (ctx, trace.get_current_span(ctx).get_span_context())
            if len(self._contexts) >= self._CACHE_SIZE:
                self._contexts.clear()
            self._contexts[key] = hit
        return hit

    def start(self, request) -> trace.Span | None:
        """The span of one ProposeRequest, or None when none of its sequences is traced."""
        parent = parent_sc = None
        links: list[Link] = []
        for s in request.sequences:
            if not s.trace_context:
                continue
            ctx, sc = self._context(s.trace_context)
            if not sc.is_valid:
                continue
            if parent is None:
                parent, parent_sc = ctx, sc
            elif sc != parent_sc and all(link.context != sc for link in links):
                links.append(Link(sc))
        if parent is None:
            return None
        return self._tracer.start_span(
            "splitspec.proposer.propose", context=parent, kind=SpanKind.SERVER, links=links,
            attributes={"splitspec.proposer.method": self._method,
                        "splitspec.proposer.step_id": request.step_id,
                        "splitspec.proposer.sequences": len(request.sequences),
                        "splitspec.proposer.released": len(request.released)})

    @staticmethod
    def finish(span: trace.Span, drafts: list[Draft]) -> None:
        if span.is_recording():
            span.set_attributes({
                "splitspec.proposer.proposed_tokens": sum(len(d.tokens) for d in drafts),
                "splitspec.proposer.resyncs": sum(1 for d in drafts if d.resync)})
        span.end()
