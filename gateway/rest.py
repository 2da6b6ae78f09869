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
import contextlib
import json
import logging
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from gateway.auth import ApiKeys, request_salt
from gateway.chat import chat_delta
from gateway.fanout import Fanout
from gateway.frontend import Collected, Frontend
from gateway.limits import ClientGone, ConcurrencyLimit, read_body
from gateway.openai_api import Generation, error_body, parse_json
from gateway.openapi import openapi_document
from gateway.rest_bodies import GenerationApi, request_usage
from protos import common_pb2
from splitspec.errors import ServiceError
from splitspec.params import STRUCTURED_FIELDS, StructuredOutput
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


@contextlib.contextmanager
def public_structured_field(structured: StructuredOutput | None):
    """A structured output's error from the verifier (a grammar that does not compile, or not
    in time) named by the field the request gave it in: the wire carries its kind, whose
    field is response_format.json_schema for a schema sent as structured_outputs.json."""
    try:
        yield
    except ServiceError as exc:  # a verifier's InvalidArgument arrives as a ServiceError
        wire_field = STRUCTURED_FIELDS[structured.kind] if structured is not None else None
        if wire_field is None or exc.field != wire_field or structured.field == wire_field:
            raise
        exc.field = structured.field
        exc.message = structured.field + exc.message.removeprefix(wire_field)
        raise


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


def build_app(frontend: Frontend, max_prompts: int = 16,
              limits: RestLimits | None = None, tool_parser: str | None = None) -> Starlette:
    """`tool_parser`: the format of auto tool choice (None: tool_choice "auto" is refused)."""
    handlers = RestHandlers(frontend, max_prompts, limits or RestLimits(), tool_parser)
    return Starlette(routes=handlers.routes, exception_handlers={
        ServiceError: _service_error, HTTPException: _http_error, Exception: _internal_error})


class RestHandlers:
    """The REST door's routes over one frontend: the two generation endpoints (each request
    authorized, counted against its key's concurrency, traced and counted in the metrics), the
    model list, health, readiness and the OpenAPI document of these very routes."""

    def __init__(self, frontend: Frontend, max_prompts: int, limits: RestLimits,
                 tool_parser: str | None = None):
        self.frontend = frontend
        self.tracer, self.metrics = frontend.tracer, frontend.metrics
        self.max_prompts = max_prompts
        self.limits = limits
        self.routes = [
            Route("/v1/completions", self._endpoint(GenerationApi(chat=False)),
                  methods=["POST"]),
            Route("/v1/chat/completions",
                  self._endpoint(GenerationApi(chat=True, tool_parser=tool_parser)),
                  methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/ready", self.ready, methods=["GET"]),
            Route("/openapi.json", self.openapi, methods=["GET"]),
        ]

    def _endpoint(self, api: GenerationApi):
        async def handle(request: Request):
            return await self.generation(api, request)

        return handle

    def _count(self, code: int) -> None:
        if self.metrics is not None:
            self.metrics.on_request("rest", str(code))

    async def generation(self, api: GenerationApi, request: Request):
        """One request to a generation endpoint: its key checked and counted against the
        concurrency limit until its response (or stream) ends; its span and status recorded."""
        tracer, concurrency = self.tracer, self.limits.concurrency
        span = tracer.start_rest(request.headers) if tracer is not None else None
        try:
            key = self.limits.api_keys.check(request.headers.get("authorization"))
            concurrency.acquire(key)
            release = _once(lambda: concurrency.release(key))
            try:
                response, streaming = await self._generate(api, request, span, release, key)
            except BaseException:
                release()
                raise
            if not streaming:
                release()
        except ServiceError as exc:
            self._count(exc.http_status)
            if span is not None:
                tracer.finish(span, None, None, [], [], exc, str(exc.http_status))
            raise
        except BaseException as exc:
            self._count(500)
            if span is not None:
                tracer.finish(span, None, None, [], [], exc, "500")
            raise
        self._count(response.status_code)
        return response

    async def _generate(self, api: GenerationApi, request: Request, span,
                        release: Callable[[], None], key: str) -> tuple:
        """(response, streaming); a streaming response ends the span and releases the
        request's concurrency slot when its stream ends. `key`: the caller's API key ("" when
        keys are off), which salts its prefix cache unless it gives a cache_salt."""
        frontend, tracer, limits = self.frontend, self.tracer, self.limits
        body = parse_json(await read_body(request, limits.max_body_bytes, limits.body_timeout_s))
        prompts, gen = api.parse(body, self.max_prompts)
        model = await frontend.check_model(gen.model)
        if span is not None:
            tracer.on_parsed(span, model, gen.sampling, gen.stopping, len(prompts) * gen.n,
                             gen.stream, operation="chat" if api.chat else "text_completion")
        cid = api.new_id()
        with public_structured_field(gen.sampling.structured):
            return await self._run(api, request, span, release, key, prompts, gen, model, cid)

    async def _run(self, api: GenerationApi, request: Request, span,
                   release: Callable[[], None], key: str, prompts: list, gen: Generation,
                   model: str, cid: str) -> tuple:
        frontend, tracer = self.frontend, self.tracer
        choices = [p for p in prompts for _ in range(gen.n)]  # choice i: prompt i // n
        pbs = await frontend.build_requests(
            [f"{cid}-{i}" for i in range(len(choices))], choices, gen.sampling, gen.stopping,
            gen.speculation, span,
            samplings=gen.choice_sampling() * len(prompts), top_logprobs=gen.top_logprobs,
            cache_salt=request_salt(gen.cache_salt, key))
        fan = Fanout(frontend, pbs, span)
        if gen.stream:
            # an error before the first token raises here: it becomes the response's status
            try:
                await _while_connected(request, fan.start(), fan)
            except ServiceError as exc:
                raise api.request_error(gen, exc) from None
            return _Stream(self._stream(api, cid, model, gen, fan, len(pbs), span, release),
                           lambda: (fan.cancel(), release()), media_type="text/event-stream",
                           headers={"Cache-Control": "no-cache"}), True
        try:
            results = await _while_connected(request, _collect(fan, len(pbs)), fan)
        except ServiceError as exc:
            raise api.request_error(gen, exc) from None
        usages = [r.usage for r in results]
        if span is not None:
            tracer.finish(span, cid, model, usages, [r.finish_reason for r in results])
        usage = request_usage(usages, gen.speculation_details, gen.n)
        return JSONResponse(api.body(cid, model, gen, results, usage)), False

    async def _stream(self, api: GenerationApi, cid: str, model: str, gen: Generation,
                      fan: Fanout, n: int, span, release: Callable[[], None]
                      ) -> AsyncIterator[str]:
        """Chunks of all choices interleaved as they come; usage last if asked for."""
        usages: list[common_pb2.Usage] = []
        reasons: list[str | None] = [None] * n
        offsets = [0] * n  # completions logprobs: where each choice's next token's text starts
        tools = api.tool_streams(gen, n)  # chat with tools: each choice's calls read as it goes
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
                    delta = api.delta(index, item.text, reason, logprobs, tools)
                    if delta is not None:
                        yield _sse(api.chunk(cid, model, [delta]))
                if reason:
                    reasons[index] = reason
                    usages.append(item.usage)
            if gen.include_usage:
                usage = request_usage(usages, gen.speculation_details, gen.n)
                yield _sse(api.chunk(cid, model, [], usage))
            yield _sse("[DONE]")
        except BaseException as exc:  # the client went away (cancelled) or the stream failed
            error = exc
            raise
        finally:
            fan.cancel()  # client gone: cancelling the pumps cancels the verifier requests
            release()
            if span is not None:
                self.tracer.finish(span, cid, model, usages, reasons, error)

    async def models(self, request: Request):
        self.limits.api_keys.check(request.headers.get("authorization"))
        info = await self.frontend.pool.info()
        return JSONResponse({"object": "list", "data": [{
            "id": info.model, "object": "model", "created": 0, "owned_by": "splitspec",
            "max_model_len": info.max_model_len,
            "speculation_methods": [p.method for p in info.proposers if p.connected]}]})

    async def health(self, request: Request):
        ok = await self.frontend.pool.healthy()
        return JSONResponse({"status": "ok" if ok else "unavailable"}, 200 if ok else 503)

    async def ready(self, request: Request):
        """A verifier is SERVING (its model loaded and warmed up) and answers Info."""
        ok = await self.frontend.pool.healthy()
        if ok:
            try:
                await self.frontend.pool.info()
            except ServiceError:
                ok = False
        return JSONResponse({"status": "ready" if ok else "not_ready"}, 200 if ok else 503)

    async def openapi(self, request: Request):
        return JSONResponse(openapi_document(self.routes, self.max_prompts))


async def _collect(fan: Fanout, n: int) -> list[Collected]:
    results = [Collected() for _ in range(n)]
    async for index, item in fan:
        if isinstance(item, ServiceError):
            raise item
        results[index].add(item)
    return results


async def _service_error(request: Request, exc: ServiceError):
    return _error_response(exc)


async def _http_error(request: Request, exc: HTTPException):
    param = "method" if exc.status_code == 405 else "path"
    return JSONResponse(error_body(f"{param}: {exc.detail}", exc.status_code, param),
                        exc.status_code, headers=exc.headers)


async def _internal_error(request: Request, exc: Exception):
    log.error("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
    return JSONResponse(error_body(f"internal error: {type(exc).__name__}", 500), 500)


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
