"""What the REST and gRPC front doors share: the checks that need the served model (model name,
prompt size, token ids), the speculation policy, picking a verifier, streaming its answer, and
collecting a finished result; metrics and the request's span, when the gateway has them, are fed
here too."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, AsyncIterator

from gateway.chat import Chat
from gateway.policy import SpeculationPolicy
from gateway.verifier_pool import VerifierPool
from protos import common_pb2
from splitspec.errors import NotFound
from splitspec.params import (
    SamplingParams,
    SpeculationRequest,
    StoppingCriteria,
    check_prompt_chars,
    check_token_ids,
    check_top_logprobs,
)
from splitspec.wire import FINISH_REASON_NAMES, sampling_to_pb, stopping_to_pb

if TYPE_CHECKING:
    from gateway.metrics import GatewayMetrics
    from gateway.tracing import GatewayTracer


@dataclass
class Collected:
    """A finished generation, assembled from its stream."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    usage: common_pb2.Usage = field(default_factory=common_pb2.Usage)
    logprobs: list[common_pb2.TokenLogprob] = field(default_factory=list)

    def add(self, msg: common_pb2.GenerateResponse) -> None:
        self.text += msg.text
        self.token_ids.extend(msg.token_ids)
        self.logprobs.extend(msg.logprobs)
        if msg.finish_reason:
            self.finish_reason = FINISH_REASON_NAMES[msg.finish_reason]
            self.usage = msg.usage


class Frontend:
    def __init__(self, pool: VerifierPool, policy: SpeculationPolicy,
                 metrics: "GatewayMetrics | None" = None, tracer: "GatewayTracer | None" = None):
        self.pool = pool
        self.policy = policy
        self.metrics = metrics
        self.tracer = tracer

    async def model_id(self) -> str:
        return (await self.pool.info()).model

    async def check_model(self, model: str | None) -> str:
        served = await self.model_id()
        if model and model != served:
            raise NotFound(f"model: {model!r} is not served here; served: {served!r}", "model")
        return served

    async def build_requests(self, request_ids: list[str], prompts: list[str | list[int] | Chat],
                             sampling: SamplingParams, stopping: StoppingCriteria,
                             speculation: SpeculationRequest, details: bool = False,
                             span=None, samplings: list[SamplingParams] | None = None,
                             top_logprobs: int | None = None
                             ) -> list[common_pb2.GenerateRequest]:
        """One GenerateRequest per prompt, all under one speculation decision; `samplings`
        (one per prompt) overrides `sampling`, e.g. for the n choices' own seeds."""
        info = await self.pool.info()
        check_top_logprobs("top_logprobs", top_logprobs)
        for prompt in prompts:  # what the verifier would refuse, refused before it is sent
            if isinstance(prompt, Chat):
                check_prompt_chars("messages", prompt.chars, info.max_model_len)
            elif isinstance(prompt, str):
                check_prompt_chars("prompt", len(prompt), info.max_model_len)
            else:
                check_token_ids("prompt", prompt)
        plan, reason = self.policy.decide_with_reason(speculation, info)
        spec = self.policy.to_pb(plan)
        spec.details = details
        if self.metrics is not None:
            for _ in prompts:
                self.metrics.on_decision(plan.method if plan.enabled else None, reason)
        if span is not None and self.tracer is not None:
            self.tracer.on_plan(span, spec, reason)
        stopping_pb = stopping_to_pb(stopping)
        samplings = samplings or [sampling] * len(prompts)
        out = []
        for request_id, prompt, params in zip(request_ids, prompts, samplings):
            req = common_pb2.GenerateRequest(request_id=request_id,
                                             sampling=sampling_to_pb(params),
                                             stopping=stopping_pb, speculation=spec)
            if top_logprobs is not None:
                req.options.top_logprobs = top_logprobs
            if isinstance(prompt, Chat):
                req.options.messages.extend(common_pb2.ChatMessage(role=r, content=c)
                                            for r, c in prompt.turns)
            elif isinstance(prompt, str):
                req.text = prompt
            else:
                req.token_ids.ids.extend(prompt)
            out.append(req)
        return out

    def stream(self, request: common_pb2.GenerateRequest
               ) -> AsyncIterator[common_pb2.GenerateResponse]:
        if self.metrics is None:
            return self.pool.generate(request)
        return self._measured(request, self.metrics)

    async def _measured(self, request: common_pb2.GenerateRequest, metrics: "GatewayMetrics"
                        ) -> AsyncIterator[common_pb2.GenerateResponse]:
        start = time.perf_counter()
        waiting_first = True
        async for msg in self.pool.generate(request):
            if waiting_first and msg.token_ids:
                waiting_first = False
                metrics.on_first_token(time.perf_counter() - start)
            if msg.finish_reason:
                u = msg.usage
                metrics.on_finished(time.perf_counter() - start, u.prompt_tokens,
                                    u.completion_tokens, u.speculation.method or None)
            yield msg

    async def collect(self, request: common_pb2.GenerateRequest) -> Collected:
        out = Collected()
        async for msg in self.stream(request):
            out.add(msg)
        return out
