"""What the REST and gRPC front doors share: apply the speculation policy, pick a verifier,
stream its answer, and collect a finished result; metrics and the request's span, when the
gateway has them, are fed here too."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, AsyncIterator

from gateway.policy import SpeculationPolicy
from gateway.verifier_pool import VerifierPool
from protos import common_pb2
from splitspec.errors import NotFound
from splitspec.params import SamplingParams, SpeculationRequest, StoppingCriteria
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

    async def build_requests(self, request_ids: list[str], prompts: list[str | list[int]],
                             sampling: SamplingParams, stopping: StoppingCriteria,
                             speculation: SpeculationRequest, details: bool = False,
                             span=None) -> list[common_pb2.GenerateRequest]:
        """One GenerateRequest per prompt, all under one speculation decision."""
        plan, reason = self.policy.decide_with_reason(speculation, await self.pool.info())
        spec = self.policy.to_pb(plan)
        spec.details = details
        if self.metrics is not None:
            for _ in prompts:
                self.metrics.on_decision(plan.method if plan.enabled else None, reason)
        if span is not None and self.tracer is not None:
            self.tracer.on_plan(span, spec, reason)
        sampling_pb, stopping_pb = sampling_to_pb(sampling), stopping_to_pb(stopping)
        out = []
        for request_id, prompt in zip(request_ids, prompts):
            req = common_pb2.GenerateRequest(request_id=request_id, sampling=sampling_pb,
                                             stopping=stopping_pb, speculation=spec)
            if isinstance(prompt, str):
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
            out.text += msg.text
            out.token_ids.extend(msg.token_ids)
            if msg.finish_reason:
                out.finish_reason = FINISH_REASON_NAMES[msg.finish_reason]
                out.usage = msg.usage
        return out
