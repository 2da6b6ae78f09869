"""What the REST and gRPC front doors share: apply the speculation policy, pick a verifier,
stream its answer, and collect a finished result."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import AsyncIterator

from gateway.policy import SpeculationPolicy
from gateway.verifier_pool import VerifierPool
from splitspec.errors import NotFound
from splitspec.params import SamplingParams, SpeculationRequest, StoppingCriteria
from splitspec.wire import FINISH_REASON_NAMES, sampling_to_pb, stopping_to_pb
from protos import common_pb2


@dataclass
class Collected:
    """A finished generation, assembled from its stream."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    usage: common_pb2.Usage = field(default_factory=common_pb2.Usage)


class Frontend:
    def __init__(self, pool: VerifierPool, policy: SpeculationPolicy):
        self.pool = pool
        self.policy = policy

    async def model_id(self) -> str:
        return (await self.pool.info()).model

    async def check_model(self, model: str | None) -> str:
        served = await self.model_id()
        if model and model != served:
            raise NotFound(f"model: {model!r} is not served here; served: {served!r}", "model")
        return served

    async def build_request(self, request_id: str, prompt: str | list[int],
                            sampling: SamplingParams, stopping: StoppingCriteria,
                            speculation: SpeculationRequest) -> common_pb2.GenerateRequest:
        plan = self.policy.decide(speculation, await self.pool.info())
        req = common_pb2.GenerateRequest(request_id=request_id,
                                         sampling=sampling_to_pb(sampling),
                                         stopping=stopping_to_pb(stopping),
                                         speculation=self.policy.to_pb(plan))
        if isinstance(prompt, str):
            req.text = prompt
        else:
            req.token_ids.ids.extend(prompt)
        return req

    def stream(self, request: common_pb2.GenerateRequest
               ) -> AsyncIterator[common_pb2.GenerateResponse]:
        return self.pool.generate(request)

    async def collect(self, request: common_pb2.GenerateRequest) -> Collected:
        out = Collected()
        async for msg in self.stream(request):
            out.text += msg.text
            out.token_ids.extend(msg.token_ids)
            if msg.finish_reason:
                out.finish_reason = FINISH_REASON_NAMES[msg.finish_reason]
                out.usage = msg.usage
        return out
