"""The gateway's span for one API request, named and attributed per the OpenTelemetry GenAI
semantic conventions: `text_completion {model}` with gen_ai.request.* set when the request is
parsed and gen_ai.usage.* / gen_ai.response.* when it ends. Project attributes are under
`splitspec.`. Its children: the gRPC client span of each generation sent to a verifier (one per
prompt), and under those everything the verifier and proposers do.

REST: the span is the server span; a W3C `traceparent` header makes it a child of the caller's.
gRPC: it sits under the gRPC server span, whose parent came in the metadata.
"""

from __future__ import annotations

from typing import Mapping

from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from protos import common_pb2
from splitspec.params import SamplingParams, SpeculationPlan, StoppingCriteria

OPERATION = "text_completion"


class GatewayTracer:
    def __init__(self, tracer: trace.Tracer):
        self._tracer = tracer

    def start_rest(self, headers: Mapping[str, str]) -> trace.Span:
        """The span of a REST request, child of its traceparent header if it has one."""
        return self._tracer.start_span(OPERATION, context=propagate.extract(headers),
                                       kind=SpanKind.SERVER, attributes=_base("rest"))

    def start_grpc(self) -> trace.Span:
        """The span of a gRPC Generate call, under the current (gRPC server) span."""
        return self._tracer.start_span(OPERATION, kind=SpanKind.INTERNAL,
                                       attributes=_base("grpc"))

    @staticmethod
    def on_parsed(span: trace.Span, model: str, sampling: SamplingParams,
                  stopping: StoppingCriteria, prompts: int, stream: bool,
                  details: dict[str, object] | None = None, operation: str = OPERATION) -> None:
        """`operation`: "text_completion", or "chat" for chat completions."""
        if not span.is_recording():
            return
        span.update_name(f"{operation} {model}")
        attributes = {
            "gen_ai.operation.name": operation,
            "gen_ai.request.model": model,
            "gen_ai.request.max_tokens": stopping.max_tokens,
            "gen_ai.request.temperature": sampling.temperature,
            "gen_ai.request.top_p": sampling.top_p,
            "splitspec.prompts": prompts,
            "splitspec.stream": stream,
        }
        if sampling.top_k:
            attributes["gen_ai.request.top_k"] = sampling.top_k
        if sampling.seed is not None:
            attributes["gen_ai.request.seed"] = sampling.seed
        if stopping.stop:
            attributes["gen_ai.request.stop_sequences"] = list(stopping.stop)
        if details:
            attributes.update(details)
        span.set_attributes(attributes)

    @staticmethod
    def on_plan(span: trace.Span, plan: SpeculationPlan, reason: str) -> None:
        if not span.is_recording():
            return
        span.set_attributes({
            "splitspec.speculation.method": plan.method if plan.enabled else "none",
            "splitspec.speculation.num_speculative_tokens": plan.k if plan.enabled else 0,
            "splitspec.speculation.reason": reason})

    @staticmethod
    def finish(span: trace.Span, response_id: str | None, model: str | None,
               usages: list[common_pb2.Usage], finish_reasons: list[str | None],
               error: BaseException | None = None, status: str | None = None) -> None:
        if span.is_recording():
            attributes: dict[str, object] = {
                "gen_ai.usage.input_tokens": sum(u.prompt_tokens for u in usages),
                "gen_ai.usage.output_tokens": sum(u.completion_tokens for u in usages),
                "gen_ai.response.finish_reasons": [r or "" for r in finish_reasons],
                "splitspec.speculation.proposed_tokens":
                    sum(u.speculation.proposed_tokens for u in usages),
                "splitspec.speculation.accepted_tokens":
                    sum(u.speculation.accepted_tokens for u in usages),
            }
            if response_id:
                attributes["gen_ai.response.id"] = response_id
            if model:
                attributes["gen_ai.response.model"] = model
            if status is not None:
                attributes["splitspec.status"] = status
            span.set_attributes(attributes)
            if error is not None:
                span.set_attribute("error.type", type(error).__name__)
                span.set_status(Status(StatusCode.ERROR, str(error)))
        span.end()


def _base(api: str) -> dict:
    return {"gen_ai.operation.name": OPERATION, "gen_ai.provider.name": "splitspec",
            "splitspec.api": api}
