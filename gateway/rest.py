"""OpenAI-compatible REST API: POST /v1/completions (JSON or SSE stream), GET /v1/models,
GET /health. Errors become `{"error": {...}}` bodies with the status from splitspec.errors.

With tracing on, each completions request gets the gateway's GenAI span (gateway/tracing.py),
a child of the caller's when the request has a W3C `traceparent` header."""

from __future__ import annotations

import asyncio
import json
import logging
from contextlib import nullcontext
from typing import AsyncIterator

from opentelemetry import trace
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from gateway.frontend import Frontend
from gateway.openai_api import (
    CompletionRequest,
    SpeculationDetails,
    choice_body,
    completion_body,
    error_body,
    new_completion_id,
    parse_completion_request,
    usage_body,
)
from protos import common_pb2
from splitspec.errors import ServiceError
from splitspec.wire import FINISH_REASON_NAMES

log = logging.getLogger(__name__)


def _usage(usages: list[common_pb2.Usage], details: bool = False) -> dict:
    methods = {u.speculation.method for u in usages if u.speculation.method}
    reasons = {u.speculation.reason for u in usages if u.speculation.reason}
    detail = None
    if details:  # prompts of one request: positions summed, steps in prompt order
        per_pos: list[int] = []
        steps: list[tuple[int, int]] = []
        for u in usages:
            s = u.speculation
            per_pos.extend([0] * (len(s.accepted_per_position) - len(per_pos)))
            for j, n in enumerate(s.accepted_per_position):
                per_pos[j] += n
            steps.extend(zip(s.step_draft_tokens, s.step_accepted_tokens))
        detail = SpeculationDetails(per_pos, steps)
    return usage_body(
        sum(u.prompt_tokens for u in usages), sum(u.completion_tokens for u in usages),
        methods.pop() if len(methods) == 1 else None,
        max((u.speculation.num_speculative_tokens for u in usages), default=0),
        sum(u.speculation.proposed_tokens for u in usages),
        sum(u.speculation.accepted_tokens for u in usages),
        sum(u.speculation.steps for u in usages), detail, ",".join(sorted(reasons)))


def _sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


def build_app(frontend: Frontend, max_prompts: int = 16) -> Starlette:
    tracer, metrics = frontend.tracer, frontend.metrics

    def count(code: int) -> None:
        if metrics is not None:
            metrics.on_request("rest", str(code))

    async def completions(request: Request):
        span = tracer.start_rest(request.headers) if tracer is not None else None
        try:
            response, streaming = await _completions(request, span)
        except ServiceError as exc:
            count(exc.http_status)
            if span is not None:
                tracer.finish(span, None, None, [], [], exc, str(exc.http_status))
            raise
        except BaseException as exc:
            count(500)
            if span is not None:
                tracer.finish(span, None, None, [], [], exc, "500")
            raise
        count(response.status_code)
        if span is not None and not streaming and response.status_code != 200:
            tracer.finish(span, None, None, [], [], None, str(response.status_code))
        return response

    async def _completions(request: Request, span) -> tuple:
        """(response, streaming); a streaming response ends the span when its stream ends."""
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return JSONResponse(error_body("body: is not valid JSON", 400, "body"), 400), False
        req = parse_completion_request(body, max_prompts)
        model = await frontend.check_model(req.model)
        if span is not None:
            tracer.on_parsed(span, model, req.sampling, req.stopping, len(req.prompts),
                             req.stream)
        cid = new_completion_id()
        pbs = await frontend.build_requests([f"{cid}-{i}" for i in range(len(req.prompts))],
                                            req.prompts, req.sampling, req.stopping,
                                            req.speculation, req.speculation_details, span)
        if req.stream:
            return StreamingResponse(_stream(cid, model, req, pbs, span),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"}), True
        with trace.use_span(span, end_on_exit=False) if span is not None else nullcontext():
            results = await asyncio.gather(*(frontend.collect(pb) for pb in pbs))
        choices = [choice_body(i, r.text, r.finish_reason) for i, r in enumerate(results)]
        usages = [r.usage for r in results]
        if span is not None:
            tracer.finish(span, cid, model, usages, [r.finish_reason for r in results])
        return JSONResponse(completion_body(cid, model, choices,
                                            _usage(usages, req.speculation_details))), False

    async def _stream(cid: str, model: str, req: CompletionRequest,
                      pbs: list[common_pb2.GenerateRequest], span) -> AsyncIterator[str]:
        """Chunks of all prompts interleaved as they come; usage last if asked for."""
        queue: asyncio.Queue = asyncio.Queue()
        usages: list[common_pb2.Usage] = []
        reasons: list[str | None] = [None] * len(pbs)
        error: BaseException | None = None

        async def pump(index: int, pb: common_pb2.GenerateRequest) -> None:
            try:
                async for msg in frontend.stream(pb):
                    await queue.put((index, msg))
            except ServiceError as exc:
                await queue.put((index, exc))
            finally:
                await queue.put((index, None))

        # The pumps inherit the span as their context: their verifier calls are its children.
        with trace.use_span(span, end_on_exit=False) if span is not None else nullcontext():
            tasks = [asyncio.create_task(pump(i, pb)) for i, pb in enumerate(pbs)]
        try:
            open_streams = len(tasks)
            while open_streams:
                index, item = await queue.get()
                if item is None:
                    open_streams -= 1
                    continue
                if isinstance(item, ServiceError):
                    error = item
                    yield _sse(error_body(item.message, item.http_status, item.field))
                    continue
                reason = FINISH_REASON_NAMES[item.finish_reason]
                if item.text or reason:
                    yield _sse(completion_body(cid, model, [choice_body(index, item.text, reason)],
                                               None) | {"usage": None})
                if reason:
                    reasons[index] = reason
                    usages.append(item.usage)
            if req.include_usage:
                yield _sse(completion_body(cid, model, [], _usage(usages,
                                                                  req.speculation_details)))
            yield _sse("[DONE]")
        except BaseException as exc:  # the client went away (cancelled) or the stream failed
            error = exc
            raise
        finally:
            for t in tasks:  # client gone: cancelling the pumps cancels the verifier requests
                t.cancel()
            if span is not None:
                tracer.finish(span, cid, model, usages, reasons, error)

    async def models(request: Request):
        info = await frontend.pool.info()
        return JSONResponse({"object": "list", "data": [{
            "id": info.model, "object": "model", "created": 0, "owned_by": "splitspec",
            "max_model_len": info.max_model_len,
            "speculation_methods": [p.method for p in info.proposers]}]})

    async def health(request: Request):
        ok = await frontend.pool.healthy()
        return JSONResponse({"status": "ok" if ok else "unavailable"}, 200 if ok else 503)

    async def service_error(request: Request, exc: ServiceError):
        return JSONResponse(error_body(exc.message, exc.http_status, exc.field),
                            exc.http_status, headers=None if exc.retry_after_s is None
                            else {"Retry-After": str(exc.retry_after_s)})

    return Starlette(routes=[
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ], exception_handlers={ServiceError: service_error})
