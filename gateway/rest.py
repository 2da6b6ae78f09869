"""OpenAI-compatible REST API: POST /v1/completions and /v1/chat/completions (JSON or SSE
stream), GET /v1/models, /health, /ready and /openapi.json. Errors become `{"error": {...}}`
bodies with the status from splitspec.errors (429s with Retry-After).

A streamed response's headers wait for every generation's first message, so an error known
before the first token is the response's status, not an event in a 200 stream. A non-streamed
request whose client disconnects is cancelled, which aborts it in the verifier. Limits (body
size and read time, API keys, concurrent requests per key) are gateway/limits.py's and
gateway/auth.py's; all are documented in docs/api.md.

With tracing on, each generation request gets the gateway's GenAI span (gateway/tracing.py),
a child of the caller's when the request has a W3C `traceparent` header."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from gateway.auth import ApiKeys
from gateway.chat import (
    chat_body,
    chat_choice,
    chat_chunk,
    chat_delta,
    chat_logprobs,
    new_chat_id,
    parse_chat_request,
)
from gateway.fanout import Fanout
from gateway.frontend import Collected, Frontend
from gateway.limits import ClientGone, ConcurrencyLimit, read_body
from gateway.openai_api import (
    Generation,
    SpeculationDetails,
    choice_body,
    completion_body,
    completion_logprobs,
    error_body,
    new_completion_id,
    parse_completion_request,
    parse_json,
    usage_body,
)
from gateway.openapi import openapi_schema
from protos import common_pb2
from splitspec.errors import ServiceError
from splitspec.wire import FINISH_REASON_NAMES

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1  # what a 429 asks the client to wait


@dataclass(frozen=True)
class RestLimits:
    """Front-door limits; 0 turns one off."""

    max_body_bytes: int = 0
    body_timeout_s: float = 0.0
    api_keys: ApiKeys = field(default_factory=ApiKeys)
    # requests in flight per API key, shared with the gRPC door when given the same object
    concurrency: ConcurrencyLimit = field(default_factory=lambda: ConcurrencyLimit(0))


def _usage(usages: list[common_pb2.Usage], details: bool = False, n: int = 1) -> dict:
    """One usage for a request's generations; its n choices of a prompt count the prompt once."""
    methods = {u.speculation.method for u in usages if u.speculation.method}
    reasons = {u.speculation.reason for u in usages if u.speculation.reason}
    modes = {u.speculation.mode for u in usages if u.speculation.mode}
    policy = {u.speculation.policy_reason for u in usages if u.speculation.policy_reason}
    detail = None
    if details:  # prompts of one request: positions summed, steps in prompt order
        per_pos: list[int] = []
        steps: list[tuple[int, int]] = []
        for u in usages:
            s = u.speculation
            per_pos.extend([0] * (len(s.accepted_per_position) - len(per_pos)))
            for j, k in enumerate(s.accepted_per_position):
                per_pos[j] += k
            steps.extend(zip(s.step_draft_tokens, s.step_accepted_tokens))
        detail = SpeculationDetails(per_pos, steps)
    return usage_body(
        sum(u.prompt_tokens for u in usages) // n, sum(u.completion_tokens for u in usages),
        methods.pop() if len(methods) == 1 else None,
        max((u.speculation.num_speculative_tokens for u in usages), default=0),
        sum(u.speculation.proposed_tokens for u in usages),
        sum(u.speculation.accepted_tokens for u in usages),
        sum(u.speculation.steps for u in usages), detail, ",".join(sorted(reasons)),
        mode=",".join(sorted(modes)), policy_reason=",".join(sorted(policy)))


def _sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


def _error_response(exc: ServiceError) -> JSONResponse:
    retry_after = exc.retry_after_s
    if retry_after is None and exc.http_status == 429:
        retry_after = RETRY_AFTER_S
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return JSONResponse(error_body(exc.message, exc.http_status, exc.field), exc.http_status,
                        headers=headers)


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _while_connected(request: Request, work, fan: Fanout):
    """Await `work` unless the client disconnects first: then cancel it and the generations
    (which aborts them in the verifier) and raise ClientGone."""
    task = asyncio.ensure_future(work)
    gone = asyncio.create_task(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
            fan.cancel()
    if task.cancelled():
        raise ClientGone("the client disconnected")
    return task.result()


@dataclass
class _Api:
    """One of the generation endpoints: how its body parses and its responses look."""

    chat: bool

    def parse(self, body, max_prompts: int) -> tuple[list, Generation]:
        if self.chat:
            req = parse_chat_request(body)
            return [req.chat], req.generation
        req = parse_completion_request(body, max_prompts)
        return req.prompts, req.generation

    def new_id(self) -> str:
        return new_chat_id() if self.chat else new_completion_id()

    def logprobs(self, gen: Generation, entries, offset: int = 0) -> dict | None:
        if gen.top_logprobs is None:
            return None
        return chat_logprobs(entries) if self.chat else completion_logprobs(entries, offset)

    def body(self, cid: str, model: str, gen: Generation, results: list[Collected],
             usage: dict) -> dict:
        if self.chat:
            return chat_body(cid, model, [chat_choice(i, r.text, r.finish_reason,
                                                      self.logprobs(gen, r.logprobs))
                                          for i, r in enumerate(results)], usage)
        return completion_body(cid, model, [choice_body(i, r.text, r.finish_reason,
                                                        self.logprobs(gen, r.logprobs))
                                            for i, r in enumerate(results)], usage)

    def chunk(self, cid: str, model: str, choices: list[dict], usage: dict | None = None
              ) -> dict:
        if self.chat:
            return chat_chunk(cid, model, choices, usage)
        return completion_body(cid, model, choices, usage)

    def delta(self, index: int, text: str, reason: str | None, logprobs: dict | None) -> dict:
        if self.chat:
            return chat_delta(index, text, reason, logprobs)
        return choice_body(index, text, reason, logprobs)


def build_app(frontend: Frontend, max_prompts: int = 16,
              limits: RestLimits | None = None) -> Starlette:
    tracer, metrics = frontend.tracer, frontend.metrics
    limits = limits or RestLimits()
    concurrency = limits.concurrency

    def count(code: int) -> None:
        if metrics is not None:
            metrics.on_request("rest", str(code))

    def endpoint(api: _Api):
        async def handle(request: Request):
            span = tracer.start_rest(request.headers) if tracer is not None else None
            try:
                key = limits.api_keys.check(request.headers.get("authorization"))
                concurrency.acquire(key)
                release = _once(lambda: concurrency.release(key))
                try:
                    response, streaming = await _generate(api, request, span, release)
                except BaseException:
                    release()
                    raise
                if not streaming:
                    release()
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
            return response

        return handle

    async def _generate(api: _Api, request: Request, span, release: Callable[[], None]
                        ) -> tuple:
        """(response, streaming); a streaming response ends the span and releases the
        request's concurrency slot when its stream ends."""
        body = parse_json(await read_body(request, limits.max_body_bytes, limits.body_timeout_s))
        prompts, gen = api.parse(body, max_prompts)
        model = await frontend.check_model(gen.model)
        if span is not None:
            tracer.on_parsed(span, model, gen.sampling, gen.stopping, len(prompts) * gen.n,
                             gen.stream, operation="chat" if api.chat else "text_completion")
        cid = api.new_id()
        choices = [p for p in prompts for _ in range(gen.n)]  # choice i: prompt i // n
        pbs = await frontend.build_requests(
            [f"{cid}-{i}" for i in range(len(choices))], choices, gen.sampling, gen.stopping,
            gen.speculation, span,
            samplings=gen.choice_sampling() * len(prompts), top_logprobs=gen.top_logprobs)
        fan = Fanout(frontend, pbs, span)
        if gen.stream:
            # an error before the first token raises here: it becomes the response's status
            await _while_connected(request, fan.start(), fan)
            return _Stream(_stream(api, cid, model, gen, fan, len(pbs), span, release),
                           lambda: (fan.cancel(), release()), media_type="text/event-stream",
                           headers={"Cache-Control": "no-cache"}), True
        results = await _while_connected(request, _collect(fan, len(pbs)), fan)
        usages = [r.usage for r in results]
        if span is not None:
            tracer.finish(span, cid, model, usages, [r.finish_reason for r in results])
        usage = _usage(usages, gen.speculation_details, gen.n)
        return JSONResponse(api.body(cid, model, gen, results, usage)), False

    async def _collect(fan: Fanout, n: int) -> list[Collected]:
        results = [Collected() for _ in range(n)]
        async for index, item in fan:
            if isinstance(item, ServiceError):
                raise item
            results[index].add(item)
        return results

    async def _stream(api: _Api, cid: str, model: str, gen: Generation, fan: Fanout, n: int,
                      span, release: Callable[[], None]) -> AsyncIterator[str]:
        """Chunks of all choices interleaved as they come; usage last if asked for."""
        usages: list[common_pb2.Usage] = []
        reasons: list[str | None] = [None] * n
        offsets = [0] * n  # completions logprobs: where each choice's next token's text starts
        error: BaseException | None = None
        try:
            if api.chat:  # the assistant role first, once per choice
                yield _sse(api.chunk(cid, model, [chat_delta(i, "", None, first=True)
                                                  for i in range(n)]))
            async for index, item in fan:
                if isinstance(item, ServiceError):
                    error = item
                    yield _sse(error_body(item.message, item.http_status, item.field))
                    continue
                reason = FINISH_REASON_NAMES[item.finish_reason]
                if item.text or reason or item.logprobs:
                    logprobs = api.logprobs(gen, item.logprobs, offsets[index])
                    offsets[index] += sum(len(e.token) for e in item.logprobs)
                    yield _sse(api.chunk(cid, model,
                                         [api.delta(index, item.text, reason, logprobs)]))
                if reason:
                    reasons[index] = reason
                    usages.append(item.usage)
            if gen.include_usage:
                yield _sse(api.chunk(cid, model, [], _usage(usages, gen.speculation_details,
                                                            gen.n)))
            yield _sse("[DONE]")
        except BaseException as exc:  # the client went away (cancelled) or the stream failed
            error = exc
            raise
        finally:
            fan.cancel()  # client gone: cancelling the pumps cancels the verifier requests
            release()
            if span is not None:
                tracer.finish(span, cid, model, usages, reasons, error)

    async def models(request: Request):
        limits.api_keys.check(request.headers.get("authorization"))
        info = await frontend.pool.info()
        return JSONResponse({"object": "list", "data": [{
            "id": info.model, "object": "model", "created": 0, "owned_by": "splitspec",
            "max_model_len": info.max_model_len,
            "speculation_methods": [p.method for p in info.proposers if p.connected]}]})

    async def health(request: Request):
        ok = await frontend.pool.healthy()
        return JSONResponse({"status": "ok" if ok else "unavailable"}, 200 if ok else 503)

    async def ready(request: Request):
        """A verifier is SERVING (its model loaded and warmed up) and answers Info."""
        ok = await frontend.pool.healthy()
        if ok:
            try:
                await frontend.pool.info()
            except ServiceError:
                ok = False
        return JSONResponse({"status": "ready" if ok else "not_ready"}, 200 if ok else 503)

    routes = [
        Route("/v1/completions", endpoint(_Api(chat=False)), methods=["POST"]),
        Route("/v1/chat/completions", endpoint(_Api(chat=True)), methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
    ]

    async def openapi(request: Request):
        return JSONResponse(openapi_schema(routes, max_prompts))

    routes.append(Route("/openapi.json", openapi, methods=["GET"]))

    async def service_error(request: Request, exc: ServiceError):
        return _error_response(exc)

    async def http_error(request: Request, exc: HTTPException):
        param = "method" if exc.status_code == 405 else "path"
        return JSONResponse(error_body(f"{param}: {exc.detail}", exc.status_code, param),
                            exc.status_code, headers=exc.headers)

    async def internal_error(request: Request, exc: Exception):
        log.error("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}", 500), 500)

    return Starlette(routes=routes, exception_handlers={ServiceError: service_error,
                                                       HTTPException: http_error,
                                                       Exception: internal_error})


class _Stream(StreamingResponse):
    """A streaming response that runs `on_close` when it ends, however it ends (also when its
    body never started because the client had gone)."""

    def __init__(self, content, on_close: Callable[[], object], **kwargs):
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


def _once(fn: Callable[[], None]) -> Callable[[], None]:
    done = False

    def call() -> None:
        nonlocal done
        if not done:
            done = True
            fn()

    return call
