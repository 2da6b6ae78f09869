"""The public gRPC Generation service: the same front door as REST, protobuf in and out, with
the same validation (splitspec.params, splitspec.wire, Frontend.build_request) and the same
optional API keys (`authorization: Bearer KEY` metadata), per-key concurrency limit and
prefix-cache salt (`cache_salt`, the caller's own or derived from its key).

This is the gRPC door's edge: the request's fields are checked here, once, with the limits REST
declares (splitspec.params), each error naming the public field: sampling (logits processors
included) and stopping as the verifier will read them, min_tokens against max_tokens,
top_logprobs and the caller's cache_salt. The sampling and stopping messages are then forwarded
to the verifier unchanged; the SpeculationConfig becomes the policy's SpeculationPlan."""

from __future__ import annotations

import uuid

import grpc
from opentelemetry import trace

from gateway.auth import ApiKeys, request_salt
from gateway.chat import chat_from_pb
from gateway.frontend import Frontend
from gateway.limits import ConcurrencyLimit
from protos import generation_pb2, generation_pb2_grpc
from splitspec.errors import InvalidArgument, ServiceError
from splitspec.params import check_cache_salt, check_min_tokens, check_top_logprobs
from splitspec.wire import (
    FINISH_REASON_NAMES,
    sampling_from_pb,
    speculation_from_pb,
    stopping_from_pb,
)


class GenerationServicer(generation_pb2_grpc.GenerationServicer):
    def __init__(self, frontend: Frontend, api_keys: ApiKeys | None = None,
                 concurrency: ConcurrencyLimit | None = None):
        self._frontend = frontend
        self._keys = api_keys or ApiKeys()
        self._concurrency = concurrency or ConcurrencyLimit(0)

    def _authorize(self, context) -> str:
        """The caller's API key ("" when keys are off)."""
        if not self._keys.enabled:
            return ""
        metadata = dict(context.invocation_metadata() or ())
        return self._keys.check(metadata.get("authorization"))

    async def Generate(self, request, context):
        tracer, metrics = self._frontend.tracer, self._frontend.metrics
        span = tracer.start_grpc() if tracer is not None else None
        usage, reason, error, code = None, None, None, grpc.StatusCode.OK
        try:
            key = self._authorize(context)
            self._concurrency.acquire(key)
            try:
                async for msg in self._generate(request, span, key):
                    if msg.finish_reason:
                        usage, reason = msg.usage, FINISH_REASON_NAMES[msg.finish_reason]
                    yield msg
            finally:
                self._concurrency.release(key)
        except ServiceError as exc:
            error, code = exc, exc.code
            raise
        except BaseException as exc:
            error, code = exc, grpc.StatusCode.CANCELLED if isinstance(
                exc, (GeneratorExit, grpc.aio.AbortError)) else grpc.StatusCode.UNKNOWN
            raise
        finally:
            if metrics is not None:
                metrics.on_request("grpc", code.name)
            if span is not None:
                tracer.finish(span, None, None, [usage] if usage is not None else [],
                              [reason], error, code.name)

    async def _generate(self, request, span, key: str):
        which = request.WhichOneof("prompt")
        if request.options.messages:
            if which is not None:
                raise InvalidArgument("messages", "a request has messages or a prompt, not both")
            prompt = chat_from_pb(request.options)
        elif which is None or (which == "text" and not request.text) or (
                which == "token_ids" and not request.token_ids.ids):
            raise InvalidArgument("prompt", "is required (text or token_ids)")
        else:
            prompt = request.text if which == "text" else list(request.token_ids.ids)
        # checked as the verifier will read them, then forwarded as they came
        has_sampling, has_stopping = request.HasField("sampling"), request.HasField("stopping")
        sampling = sampling_from_pb(request.sampling, has_sampling).validate()
        stopping = stopping_from_pb(request.stopping, has_stopping).validate()
        check_min_tokens(sampling, stopping)
        top_logprobs = (request.options.top_logprobs
                        if request.options.HasField("top_logprobs") else None)
        check_top_logprobs("top_logprobs", top_logprobs)
        own_salt = request.cache_salt if request.HasField("cache_salt") else None
        check_cache_salt("cache_salt", own_salt)
        if span is not None:
            self._frontend.tracer.on_parsed(span, await self._frontend.model_id(), sampling,
                                            stopping, 1, True)
        pb = await self._frontend.build_request(
            request.request_id or "gen-" + uuid.uuid4().hex, prompt,
            request.sampling if has_sampling else None, sampling.greedy,
            request.stopping if has_stopping else None, speculation_from_pb(request.speculation),
            span, top_logprobs=top_logprobs, cache_salt=request_salt(own_salt, key))
        stream = self._frontend.stream(pb)
        if span is None:
            async for msg in stream:
                yield msg
            return
        with trace.use_span(span, end_on_exit=False):
            async for msg in stream:
                yield msg

    async def ListModels(self, request, context):
        self._authorize(context)
        info = await self._frontend.pool.info()
        return generation_pb2.ListModelsResponse(models=[generation_pb2.ModelCard(
            id=info.model,
            speculation_methods=[p.method for p in info.proposers if p.connected],
            max_model_len=info.max_model_len)])
