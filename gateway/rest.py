"""OpenAI-compatible REST API: POST /v1/completions (JSON or SSE stream), GET /v1/models,
GET /health. Errors become `{"error": {...}}` bodies with the status from splitspec.errors."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from gateway.frontend import Frontend
from gateway.openai_api import (CompletionRequest, choice_body, completion_body, error_body,
                                new_completion_id, parse_completion_request, usage_body)
from splitspec.errors import ServiceError
from splitspec.wire import FINISH_REASON_NAMES
from protos import common_pb2

log = logging.getLogger(__name__)


def _usage(usages: list[common_pb2.Usage]) -> dict:
    methods = {u.speculation.method for u in usages if u.speculation.method}
    return usage_body(
        sum(u.prompt_tokens for u in usages), sum(u.completion_tokens for u in usages),
        methods.pop() if len(methods) == 1 else None,
        max((u.speculation.num_speculative_tokens for u in usages), default=0),
        sum(u.speculation.proposed_tokens for u in usages),
        sum(u.speculation.accepted_tokens for u in usages),
        sum(u.speculation.steps for u in usages))


def _sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


def build_app(frontend: Frontend, max_prompts: int = 16) -> Starlette:
    async def completions(request: Request):
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return JSONResponse(error_body("body: is not valid JSON", 400, "body"), 400)
        req = parse_completion_request(body, max_prompts)
        model = await frontend.check_model(req.model)
        cid = new_completion_id()
        pbs = [await frontend.build_request(f"{cid}-{i}", p, req.sampling, req.stopping,
                                            req.speculation)
               for i, p in enumerate(req.prompts)]
        if req.stream:
            return StreamingResponse(_stream(cid, model, req, pbs),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        results = await asyncio.gather(*(frontend.collect(pb) for pb in pbs))
        choices = [choice_body(i, r.text, r.finish_reason) for i, r in enumerate(results)]
        return JSONResponse(completion_body(cid, model, choices,
                                            _usage([r.usage for r in results])))

    async def _stream(cid: str, model: str, req: CompletionRequest,
                      pbs: list[common_pb2.GenerateRequest]) -> AsyncIterator[str]:
        """Chunks of all prompts interleaved as they come; usage last if asked for."""
        queue: asyncio.Queue = asyncio.Queue()
        usages: list[common_pb2.Usage] = []

        async def pump(index: int, pb: common_pb2.GenerateRequest) -> None:
            try:
                async for msg in frontend.stream(pb):
                    await queue.put((index, msg))
            except ServiceError as exc:
                await queue.put((index, exc))
            finally:
                await queue.put((index, None))

        tasks = [asyncio.create_task(pump(i, pb)) for i, pb in enumerate(pbs)]
        try:
            open_streams = len(tasks)
            while open_streams:
                index, item = await queue.get()
                if item is None:
                    open_streams -= 1
                    continue
                if isinstance(item, ServiceError):
                    yield _sse(error_body(item.message, item.http_status, item.field))
                    continue
                reason = FINISH_REASON_NAMES[item.finish_reason]
                if item.text or reason:
                    yield _sse(completion_body(cid, model, [choice_body(index, item.text, reason)],
                                               None) | {"usage": None})
                if reason:
                    usages.append(item.usage)
            if req.include_usage:
                yield _sse(completion_body(cid, model, [], _usage(usages)))
            yield _sse("[DONE]")
        finally:
            for t in tasks:  # client gone: cancelling the pumps cancels the verifier requests
                t.cancel()

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
                            exc.http_status)

    return Starlette(routes=[
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ], exception_handlers={ServiceError: service_error})
